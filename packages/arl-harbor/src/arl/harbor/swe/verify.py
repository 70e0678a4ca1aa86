"""Check a built task set on the host (no container): per task, in temp copies of its testbed, with the
package's venv, run the task's own tests/test.sh after
  - the oracle (solution/solve.sh)                → reward must be 1.0,
  - nothing                                        → reward must be 0.0,
  - an agent that edits the tests to pass (the failing test files emptied and a conftest.py that
    passes every test without running it)          → reward must not be 1.0.
The docker and local-sandbox checks of the same tasks belong to the environment helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from arl.harbor.tasks import validate_task

_CHEAT_CONFTEST = """import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    return True  # every test "passes" without running its body
"""
_RUN_TIMEOUT_SEC = 600


@dataclass
class TaskCheck:
    """One task's verify result: rewards per scenario (None: no reward file) and problems."""

    id: str
    rewards: dict[str, float | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def host_grading_env(task: Path, testbed: Path, logs: Path, python: Path) -> dict[str, str]:
    """The environment that runs a task's tests/test.sh on the host instead of its grading environment:
    the testbed and logs given, the set's venv of the package (the sandbox binds it at /arl/venv), the
    task's own testbed as the base copy, and pytest run as the caller (no user of its own to drop to)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        ARL_SWE_TESTBED=str(testbed),
        ARL_SWE_LOGS=str(logs),
        ARL_SWE_PYTHON=str(python),
        ARL_SWE_BASE=str(task / "environment" / "testbed"),
        ARL_SWE_RUNNER_UID="",
    )
    return env


def run_scenario(task: Path, python: Path, scenario: str, config: dict) -> tuple[dict | None, str]:
    """Run one scenario ("oracle", "untouched", "edit_tests") in a temp copy of the task's testbed: the
    verifier's reward.json (None: it wrote none) and why not."""
    with tempfile.TemporaryDirectory(prefix="arl-swe-verify-") as tmp:
        testbed, logs = Path(tmp) / "testbed", Path(tmp) / "logs"
        shutil.copytree(task / "environment" / "testbed", testbed, symlinks=True)
        env = host_grading_env(task, testbed, logs, python)
        if scenario == "oracle":
            proc = subprocess.run(
                ["bash", str(task / "solution" / "solve.sh")],
                env=env,
                capture_output=True,
                text=True,
                timeout=_RUN_TIMEOUT_SEC,
            )
            if proc.returncode != 0:
                return None, f"solve.sh failed: {proc.stderr[-500:]}"
        elif scenario == "edit_tests":
            for f in sorted({t.split("::", 1)[0] for t in config["fail_to_pass"]}):
                (testbed / f).parent.mkdir(parents=True, exist_ok=True)  # a new test file of tests/test.patch
                (testbed / f).write_text("")
            (testbed / "conftest.py").write_text(_CHEAT_CONFTEST)
        proc = subprocess.run(
            ["bash", str(task / "tests" / "test.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=_RUN_TIMEOUT_SEC,
        )
        reward_file = logs / "reward.json"
        if not reward_file.is_file():
            return None, f"test.sh exit {proc.returncode}, no reward: {proc.stderr[-500:]}"
        return json.loads(reward_file.read_text()), ""


def verify_task(task: Path, set_dir: Path) -> TaskCheck:
    """Run the three scenarios on one task dir."""
    check = TaskCheck(task.name)
    info = validate_task(task)
    if not info.ok:
        check.problems += [f"invalid task: {p}" for p in info.problems]
        return check
    config = json.loads((task / "tests" / "config.json").read_text())
    python = (
        set_dir / "_venvs" / config["package"] / "bin" / "python"
    )  # not resolved: a venv's python is a link
    if not python.exists():
        check.problems.append(f"no venv for {config['package']} in {set_dir / '_venvs'}")
        return check
    expected = {
        "oracle": lambda r: r == 1.0,
        "untouched": lambda r: r == 0.0,
        "edit_tests": lambda r: r != 1.0,
    }
    for scenario, good in expected.items():
        written, why = run_scenario(task, python, scenario, config)
        reward = None if written is None else float(written["reward"])
        check.rewards[scenario] = reward
        if reward is None or not good(reward):
            check.problems.append(f"{scenario}: reward {reward} {why}".strip())
    return check


def task_dirs(set_dir: Path, ids: list[str] | None = None) -> list[Path]:
    """The task dirs of a set (sorted), or the ones named by `ids` (an unknown id is an error)."""
    dirs = sorted(d for d in set_dir.iterdir() if (d / "task.toml").is_file())
    if ids:
        known = {d.name: d for d in dirs}
        missing = [i for i in ids if i not in known]
        if missing:
            raise ValueError(f"no such task(s) in {set_dir}: {missing}")
        dirs = [known[i] for i in ids]
    return dirs


def verify_set(set_dir: Path, ids: list[str] | None = None, *, jobs: int = 2, log=print) -> list[TaskCheck]:
    """verify_task on every (or the named) task of a set, `jobs` at a time, in order."""
    dirs = task_dirs(set_dir, ids)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        checks = []
        for check in pool.map(lambda d: verify_task(d, set_dir), dirs):
            log(f"{'ok  ' if check.ok else 'FAIL'} {check.id} {check.rewards} {'; '.join(check.problems)}")
            checks.append(check)
    return checks
