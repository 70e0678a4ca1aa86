"""The Harbor task dir of one SWE task: it validates (arl and Harbor's own TaskConfig), and its
tests/test.sh writes the right reward.json for the bug, for the oracle, for edited tests, and none when
pytest is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from harbor.models.task.config import TaskConfig

from arl.harbor.swe.issue import write_issue
from arl.harbor.swe.testing import write_tiny_package
from arl.harbor.swe.venvs import copy_venv
from arl.harbor.swe.verify import host_grading_env
from arl.harbor.swe.writer import TaskRecord, write_task
from arl.harbor.tasks import resolve_source, validate_task

F2P = ["tests/test_tinycalc.py::test_clamp_high", "tests/test_tinycalc.py::test_clamp_low"]
P2P = ["tests/test_tinycalc.py::test_clamp_inside", "tests/test_tinycalc.py::test_counter"]


@pytest.fixture
def task(tmp_path):
    root = tmp_path / "src" / "tinycalc-0.0.1"
    spec = write_tiny_package(root)
    original = (root / "tinycalc" / "__init__.py").read_text()
    buggy = original.replace("    if x < lo:\n        return lo", "    if x < lo:\n        return hi")
    buggy = buggy.replace("    elif x > hi:\n        return hi", "    elif x > hi:\n        return lo")
    assert buggy != original
    record = TaskRecord(
        id="tinycalc__clamp",
        package=spec.name,
        version=spec.version,
        module="tinycalc/__init__.py",
        function="clamp",
        operator="func_pm_ctrl_invert_if",
        fail_to_pass=F2P,
        pass_to_pass=P2P,
        validate_s=0.5,
        test_files=["tests/test_tinycalc.py"],
    )
    messages = {
        F2P[0]: "tests/test_tinycalc.py:14: in test_clamp_high\n    assert clamp(30, 0, 10) == 10\n"
        "E   assert 0 == 10"
    }
    instruction = write_issue(spec.name, spec.version, F2P, messages, len(P2P))
    out = tmp_path / "set"
    venv = copy_venv(Path(sys.prefix), out / "_venvs" / spec.name, link=True)  # this env has pytest
    return write_task(
        out / record.id,
        record=record,
        spec=spec,
        pristine_root=root,
        buggy_text=buggy,
        instruction=instruction,
        wheelhouse=None,
        venv_dir=venv,
    )


def _test_sh(
    task_dir: Path, testbed: Path, logs: Path, python: str | None = None
) -> subprocess.CompletedProcess:
    env = host_grading_env(
        task_dir, testbed, logs, Path(python or task_dir.parent / "_venvs" / "tinycalc" / "bin" / "python")
    )
    return subprocess.run(
        ["bash", str(task_dir / "tests" / "test.sh")], env=env, capture_output=True, text=True, timeout=300
    )


def _testbed(task_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run" / "testbed"
    dest.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(task_dir / "environment" / "testbed"), str(dest)], check=True, timeout=60)
    return dest


def test_task_dir_is_valid_and_complete(task):
    info = validate_task(task)
    assert info.ok, info.problems
    assert info.has_solution and info.network_mode == "no-network" and info.cpus == 1
    config = TaskConfig.model_validate(tomllib.loads((task / "task.toml").read_text()))
    assert (
        config.environment.workdir == "/testbed" and config.metadata["operator"] == "func_pm_ctrl_invert_if"
    )
    assert resolve_source(f"harbor:{task.parent}")[0][0] == "tinycalc__clamp"
    dockerfile = (task / "environment" / "Dockerfile").read_text()
    assert dockerfile.startswith(
        "FROM arl-swe-base:bookworm\nCOPY testbed /testbed\nCOPY testbed /arl/base\n"
    )
    assert "WORKDIR /testbed" in dockerfile
    assert "wheels" not in dockerfile  # no extra test deps
    assert "ENV PATH=/arl/venv/bin:$PATH" in dockerfile
    binds = json.loads((task / "environment" / "local_binds.json").read_text())
    assert binds == {"/arl/venv": "../../_venvs/tinycalc", "/arl/base": "testbed"}
    assert (task / "environment" / binds["/arl/venv"] / "bin" / "python").exists()
    log = subprocess.run(
        ["git", "log", "--oneline"],
        cwd=task / "environment" / "testbed",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(log.splitlines()) == 1
    config_json = json.loads((task / "tests" / "config.json").read_text())
    assert config_json["fail_to_pass"] == F2P and config_json["pass_to_pass"] == P2P
    assert config.verifier.environment_mode == "separate" and config.artifacts == ["/testbed"]
    assert sorted(p.name for p in (task / "tests" / "plugin").iterdir()) == [
        "arl_swe_report.py",
        "grade_change.py",
        "pytest.ini",
        "score.py",
    ]
    instruction = (task / "instruction.md").read_text()
    assert "test_clamp_high" in instruction and "assert 0 == 10" in instruction
    assert "invert" not in instruction and "func_pm" not in instruction and "clamp(" in instruction


def test_test_sh_rewards_bug_oracle_and_edited_tests(task, tmp_path):
    testbed, logs = _testbed(task, tmp_path), tmp_path / "run" / "logs"
    proc = _test_sh(task, testbed, logs)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((logs / "reward.json").read_text()) == {
        "reward": 0.0,
        "fail_to_pass": 0.0,
        "pass_to_pass": 1.0,
        "protected_touched": 0.0,
    }

    # An agent that rewrites the failing tests gains nothing: the pristine tests are put back.
    (testbed / "tests" / "test_tinycalc.py").write_text("def test_clamp_high():\n    pass\n")
    (testbed / "conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_pyfunc_call(pyfuncitem):\n    return True\n"
    )
    assert _test_sh(task, testbed, logs).returncode == 0
    reward = json.loads((logs / "reward.json").read_text())
    assert reward["reward"] == 0.0 and reward["protected_touched"] == 2.0
    assert not (testbed / "conftest.py").exists()
    change = json.loads((logs / "change.json").read_text())
    assert change["restored"] == {"tests/test_tinycalc.py": "test"} and change["deleted"] == {
        "conftest.py": "test"
    }

    env = {**os.environ, "ARL_SWE_TESTBED": str(testbed)}
    subprocess.run(
        ["bash", str(task / "solution" / "solve.sh")], env=env, check=True, capture_output=True, timeout=60
    )
    proc = _test_sh(task, testbed, logs)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((logs / "reward.json").read_text()) == {
        "reward": 1.0,
        "fail_to_pass": 1.0,
        "pass_to_pass": 1.0,
        "protected_touched": 0.0,
    }


def test_test_sh_writes_no_reward_when_pytest_is_missing(task, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    testbed, logs = _testbed(task, tmp_path), tmp_path / "run" / "logs"
    proc = _test_sh(task, testbed, logs, python=str(bare / "bin" / "python"))
    assert proc.returncode != 0
    assert "pytest is not importable" in proc.stderr
    assert not (logs / "reward.json").exists()


def test_test_sh_grades_a_removed_testbed_as_an_empty_change(task, tmp_path):
    """The agent deleted /testbed: its tests come back from the base, its source does not; a plain 0."""
    proc = _test_sh(task, tmp_path / "nowhere", tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr
    reward = json.loads((tmp_path / "logs" / "reward.json").read_text())
    assert (
        reward["reward"] == 0.0 and reward["protected_touched"] > 0 and "agent_broke_verifier" not in reward
    )


def test_test_sh_writes_no_reward_without_its_base_copy(task, tmp_path):
    testbed, logs = _testbed(task, tmp_path), tmp_path / "run" / "logs"
    env = host_grading_env(task, testbed, logs, task.parent / "_venvs" / "tinycalc" / "bin" / "python")
    env["ARL_SWE_BASE"] = str(tmp_path / "no-base")
    proc = subprocess.run(
        ["bash", str(task / "tests" / "test.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 3 and "no base copy" in proc.stderr
    assert not (logs / "reward.json").exists()


def test_issue_text_shows_the_tasks_own_paths(tmp_path):
    """Tracebacks in instruction.md name /testbed and the image's interpreter, never the builder's folders."""
    from arl.harbor.swe.issue import IMAGE_SITE_PACKAGES, task_paths

    venv, worker = tmp_path / "cache" / "venvs" / "pkg-1.0", tmp_path / "cache" / "work" / "pkg-1.0" / "w0"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    worker.mkdir(parents=True)
    text = (
        f"{worker}/pkg/mod.py:12: in add\n    return a - b\n"
        f"{venv}/lib/python3.11/site-packages/_pytest/python.py:166: in pytest_pyfunc_call\n"
        f"{venv}/bin/python -m pytest\n"
    )
    out = task_paths(text, testbed=worker, venv=venv)
    assert str(tmp_path) not in out
    assert "/testbed/pkg/mod.py:12: in add" in out
    assert f"{IMAGE_SITE_PACKAGES}/_pytest/python.py:166" in out and "/usr/bin/python -m pytest" in out


def test_test_sh_refuses_a_test_patch_that_does_not_apply_to_its_base(task, tmp_path):
    """A task whose own tests cannot be applied is broken: no reward (retried, then dropped), never the
    agent's 0."""
    (task / "tests" / "test.patch").write_text(
        "--- a/tests/test_tinycalc.py\n+++ b/tests/test_tinycalc.py\n@@ -1,1 +1,1 @@\n-no such line\n+x\n"
    )
    testbed, logs = _testbed(task, tmp_path), tmp_path / "run" / "logs"
    proc = _test_sh(task, testbed, logs)
    assert proc.returncode == 3 and "test.patch does not apply" in proc.stderr
    assert not (logs / "reward.json").exists()


def test_the_pytest_config_auto_is_the_bases_own(tmp_path):
    import importlib.util

    from arl.harbor.swe.runner import TASK_FILES

    spec = importlib.util.spec_from_file_location("grade_change", TASK_FILES / "grade_change.py")
    grade_change = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grade_change)
    assert grade_change.own_pytest_config(tmp_path) == ""
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    assert grade_change.own_pytest_config(tmp_path) == ""  # no [tool:pytest] section: not pytest's
    (tmp_path / "tox.ini").write_text("[pytest]\naddopts = -q\n")
    assert grade_change.own_pytest_config(tmp_path) == "tox.ini"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    assert grade_change.own_pytest_config(tmp_path) == "pytest.ini"


def test_a_fix_that_puts_back_a_reach_pattern_is_not_refused(tmp_path):
    """A bug that removed a `sys.modules` line is fixed by putting it back: the task's reach patterns leave
    out what its own fix adds, and only that."""
    from arl.harbor.swe.grading import grade_change_module, needed_reach_patterns, reach_patterns_without

    original = "import sys\n\ndef f():\n    sys.modules['x'] = 1\n    return 1\n"
    buggy = "import sys\n\ndef f():\n    return 1\n"
    needed = needed_reach_patterns(original, buggy)
    assert needed == {r"\bsys\.modules\b"}
    reach = reach_patterns_without(needed)
    assert r"\bsys\.modules\b" not in reach and r"\bpytest\b" in reach
    assert len(reach) == len(grade_change_module().DEFAULT_REACH_PATTERNS) - 1
    assert (
        reach_patterns_without(needed_reach_patterns(buggy, original)) is None
    )  # a fix that removes: nothing
