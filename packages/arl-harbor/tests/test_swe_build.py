"""End to end on a tiny local package (no download): the builder keeps real bugs, writes Harbor task dirs,
does the same for the same seed whatever --jobs is, and every task passes the host checks
(oracle 1.0, untouched 0.0, edited tests not 1.0)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from arl.harbor.swe.build import build_package
from arl.harbor.swe.testing import write_tiny_package
from arl.harbor.swe.verify import verify_set
from arl.harbor.tasks import load_harbor_tasks


@pytest.mark.slow
def test_build_tiny_package_end_to_end(tmp_path):
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
