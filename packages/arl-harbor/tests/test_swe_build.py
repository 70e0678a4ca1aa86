"""End to end on a tiny local package (no download): the builder keeps real bugs, writes Harbor task dirs,
does the same for the same seed whatever --jobs is, and every task passes the host checks
(oracle 1.0, untouched 0.0, edited tests not 1.0)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from arl.harbor.errors import PackageRefusedError
from arl.harbor.swe.build import build, build_package
from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.testing import write_tiny_package
from arl.harbor.swe.validate import probe_suite
from arl.harbor.swe.venvs import DEBIAN_PYTHON
from arl.harbor.swe.verify import run_scenario, verify_set
from arl.harbor.tasks import load_harbor_tasks


@pytest.mark.slow
def test_build_tiny_package_end_to_end(tmp_path, monkeypatch):
    root = tmp_path / "tinycalc-0.0.1"
    spec = write_tiny_package(root)
    sets = {}
    for jobs in (1, 2):
        out = tmp_path / f"set-{jobs}"
        records, stats = build_package(
            spec,
            out,
            tmp_path / "cache",
            max_tasks=2,
            max_candidates=60,
            jobs=jobs,
            seed=7,
            python=sys.executable,
            log=lambda _msg: None,
            source_root=root,
            venv=Path(sys.prefix),
        )
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
    assert reward == {
        "reward": 1.0,
        "fail_to_pass": 1.0,
        "pass_to_pass": 1.0,
        "pass_to_pass_rerun": 1,
        "pass_to_pass_flaky": 1,
        "protected_touched": 0.0,
    }
    monkeypatch.setenv(
        "TINY_TALLY", str(tmp_path / "no-such-dir" / "tally")
    )  # never written: fails every time
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


# Refusals, measured on the tiny package made unfit in one way each (no download: its source and this venv).
_REFUSALS = {
    "no_tests": (
        {"tests/test_tinycalc.py": None},
        {},
        "pytest collected no tests in",
        "the sdist ships no test files",
    ),
    "not_collected": (
        {"tests/test_tinycalc.py": None, "tests/checks.py": "def test_x():\n    pass\n"},
        {},
        "pytest collected no tests",
        "has 1 test file(s) that it does not collect",
    ),
    "does_not_collect": (
        {"tests/test_broken.py": "import tinycalc_plugin_we_lack\n"},
        {},
        "1 collection error(s), e.g. tests/test_broken.py",
        "ModuleNotFoundError",
    ),
    "too_slow": (
        {"tests/test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(60)\n"},
        {"max_suite_s": 3.0},
        "ran past the 3 s limit",
        "--max-suite-seconds",
    ),
    "no_passing_tests": (
        {
            "tests/conftest.py": "import pytest\n\n@pytest.fixture(autouse=True)\ndef _broken():\n"
            "    raise RuntimeError('no fixture works here')\n"
        },
        {},
        "none of the 12 tests passed",
        "no fixture works here",
    ),
}


@pytest.mark.parametrize("case", sorted(_REFUSALS))
def test_unfit_packages_are_refused_with_what_was_measured(tmp_path, case):
    files, kwargs, *expected = _REFUSALS[case]
    root = tmp_path / "tinycalc-0.0.1"
    spec = write_tiny_package(root)
    for rel, text in files.items():
        if text is None:
            (root / rel).unlink()
        else:
            (root / rel).write_text(text)
    with pytest.raises(PackageRefusedError) as refused:
        build_package(
            spec,
            tmp_path / "set",
            tmp_path / "cache",
            max_tasks=2,
            max_candidates=60,
            jobs=1,
            seed=0,
            python=sys.executable,
            log=lambda _msg: None,
            source_root=root,
            venv=Path(sys.prefix),
            **kwargs,
        )
    kind = "no_tests" if case == "not_collected" else case
    assert refused.value.kind == kind and refused.value.package == "tinycalc-0.0.1"
    assert all(text in refused.value.reason for text in expected), refused.value.reason
    assert not (tmp_path / "set").exists()  # refused before any task was written
    if case == "does_not_collect":  # what the reason advises works: the file left out, the suite runs
        fixed = PackageSpec(spec.name, spec.version, skip_test_files=("tests/test_broken.py",))
        probe = probe_suite(root, Path(sys.prefix) / "bin" / "python", fixed, limit_s=60)
        assert probe.tests == probe.passed == 12


def test_build_lists_a_refused_package_and_goes_on(tmp_path):
    # A cached source tree stands in for the sdist; its src_root does not exist, so nothing is downloaded.
    cache = tmp_path / "cache"
    write_tiny_package(cache / "src" / "tinycalc-0.0.1")
    bad = PackageSpec("tinycalc", "0.0.1", src_root="src")
    summary = build(
        [bad],
        tmp_path / "set",
        cache,
        max_per_package=2,
        max_candidates=10,
        jobs=1,
        seed=0,
        python=sys.executable,
        log=lambda _msg: None,
    )
    assert summary["packages"] == [] and summary["tasks_in_set"] == 0
    [refusal] = summary["refused"]
    assert refusal["package"] == "tinycalc" and refusal["kind"] == "bad_src_root"
    assert (
        "src_root 'src' is not a folder of the sdist (its folders: ['tests', 'tinycalc'])"
        in refusal["reason"]
    )
    assert json.loads((tmp_path / "set" / "build.json").read_text())["refused"] == [refusal]


def _pypi_reachable() -> bool:
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


needs_pypi = pytest.mark.skipif(
    not Path(DEBIAN_PYTHON).is_file() or not _pypi_reachable(),
    reason=f"needs PyPI and Debian's {DEBIAN_PYTHON} (the task image's interpreter)",
)


@pytest.mark.slow
@needs_pypi
@pytest.mark.exhaustive(
    reason="the command line on two real packages from PyPI: the mutation build is checked every run on a local "
    "package (above), a real sdist from PyPI by test_swe_releases.py, the refusals by the local refusal tests"
)
def test_build_any_pypi_package_from_the_command_line(tmp_path, capsys):
    """`--package NAME==VERSION` of a package not in the pinned list builds valid tasks from its sdist; one whose
    sdist ships no tests (tomli's) is refused with that reason, and the build goes on."""
    from arl.harbor.swe.__main__ import main
    from arl.harbor.swe.packages import BY_NAME

    assert "xmltodict" not in BY_NAME and "tomli" not in BY_NAME
    out = tmp_path / "set"
    rc = main(
        [
            "build",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "cache"),
            "--jobs",
            "1",
            "--max-per-package",
            "2",
            "--package",
            "xmltodict==1.0.4",
            "--package",
            "tomli==2.5.0",
            "--src-root",
            "src",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    summary = json.loads((out / "build.json").read_text())
    [built] = summary["packages"]
    assert built["package"] == "xmltodict" and built["kept"] == 2 and built["tests"] > 100
    [refused] = summary["refused"]
    assert refused["package"] == "tomli" and refused["kind"] == "no_tests"
    assert "the sdist ships no test files" in refused["reason"]
    assert "tomli 2.5.0: refused (no_tests): pytest collected no tests" in err
    tasks = load_harbor_tasks(f"harbor:{out}")
    assert len(tasks) == 2 and all(t.id.startswith("xmltodict__") for t in tasks)
    checks = verify_set(out, jobs=1, log=lambda _msg: None)
    assert all(c.rewards == {"oracle": 1.0, "untouched": 0.0, "edit_tests": 0.0} for c in checks)

    # Only tomli again: every package refused, so the command fails.
    rc = main(
        [
            "build",
            "--out",
            str(tmp_path / "none"),
            "--cache",
            str(tmp_path / "cache"),
            "--jobs",
            "1",
            "--package",
            "tomli==2.5.0",
        ]
    )
    assert rc == 1
