"""End to end on a tiny local package (no download): the builder keeps real bugs, writes Harbor task dirs,
does the same for the same seed whatever --jobs is, and every task passes the host checks
(oracle 1.0, untouched 0.0, edited tests not 1.0)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from arl.harbor.swe.build import build_package
from arl.harbor.swe.testing import write_tiny_package
from arl.harbor.swe.verify import run_scenario, verify_set
from arl.harbor.tasks import load_harbor_tasks


@pytest.mark.slow
def test_build_tiny_package_end_to_end(tmp_path, monkeypatch):
    root = tmp_path / "tinycalc-0.0.1"
    spec = write_tiny_package(root)
    sets = {}
    for jobs in (1, 2):
        out = tmp_path / f"set-{jobs}"
        records, stats = build_package(spec, out, tmp_path / "cache", max_tasks=2, max_candidates=60, jobs=jobs,
                                       seed=7, python=sys.executable, log=lambda _msg: None, source_root=root,
                                       venv=Path(sys.prefix))
        sets[jobs] = (out, [(r.id, r.fail_to_pass) for r in records])
        assert stats.kept == len(records) == 2 and stats.candidates >= 2
        assert len({r.function for r in records}) == 2  # one task per function
        for r in records:
            assert r.fail_to_pass and r.pass_to_pass and r.operator.startswith("func_pm_")
            assert not set(r.fail_to_pass) & set(r.pass_to_pass)
    assert sets[1][1] == sets[2][1]  # deterministic given the seed

    out = sets[2][0]
    tasks = load_harbor_tasks(f"harbor:{out}")
    assert len(tasks) == 2
    checks = verify_set(out, jobs=2, log=lambda _msg: None)
    assert [c.problems for c in checks] == [[], []]
    assert all(c.rewards == {"oracle": 1.0, "untouched": 0.0, "edit_tests": 0.0} for c in checks)

    # A PASS_TO_PASS test that fails once (a flake) is run once more and counts when it passes then; one
    # that always fails is rerun and still fails the task; with FAIL_TO_PASS failing nothing is rerun.
    task = out / records[0].id
    config = json.loads((task / "tests" / "config.json").read_text())
    victim = config["pass_to_pass"][0]
    base = task / "environment" / "testbed" / victim.split("::", 1)[0]  # the grader's base copy of the tests
    base.write_text(base.read_text() + FAILS_WHILE_NO_TALLY.format(node_id=victim))
    tally = tmp_path / "tally"
    python = out / "_venvs" / spec.name / "bin" / "python"
    monkeypatch.setenv("TINY_TALLY", str(tally))
    reward, _ = run_scenario(task, python, "oracle", config)
    assert reward == {"reward": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0,
                      "pass_to_pass_rerun": 1, "pass_to_pass_flaky": 1, "protected_touched": 0.0}
    monkeypatch.setenv("TINY_TALLY", str(tmp_path / "no-such-dir" / "tally"))  # never written: fails every time
    reward, _ = run_scenario(task, python, "oracle", config)
    assert reward["reward"] == 0.0 and reward["pass_to_pass_rerun"] == 1 and reward["pass_to_pass_flaky"] == 0
    reward, _ = run_scenario(task, python, "untouched", config)
    assert reward["reward"] == 0.0 and "pass_to_pass_rerun" not in reward


FAILS_WHILE_NO_TALLY = """

import os as _os


@pytest.fixture(autouse=True)
def _flaky(request):
    tally = _os.environ.get("TINY_TALLY")
    if request.node.nodeid == "{node_id}" and tally and not _os.path.exists(tally):
        try:
            open(tally, "w").close()
        except OSError:
            pass
        pytest.fail("a flake: fails while the tally file is missing")
"""
