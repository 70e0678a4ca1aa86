"""Run pytest on a testbed with a package's venv and read back every test's outcome by node id.

The same plugin (`task_files/arl_swe_report.py`) that the tasks' verifier loads writes the outcomes, so
the builder's node ids are exactly the ones the verifier later looks up. Each run has a timeout; the
whole process group is killed when it expires (a mutation can loop forever).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TASK_FILES = Path(__file__).with_name("task_files")


def own_config(testbed: Path) -> Path | None:
    """The testbed's pytest config file, found as pytest looks in the rootdir (None: it has none)."""
    markers = {
        "pytest.ini": None,
        ".pytest.ini": None,
        "pyproject.toml": ("[tool.pytest.ini_options]", "[tool.pytest]"),
        "tox.ini": ("[pytest]",),
        "setup.cfg": ("[tool:pytest]",),
    }
    for name, sections in markers.items():
        path = testbed / name
        if path.is_file() and (
            sections is None or any(s in path.read_text(errors="replace") for s in sections)
        ):
            return path
    return None


@dataclass
class PytestRun:
    """What one pytest run left: outcome per node id, failure texts, collection errors, timing."""

    tests: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    exitstatus: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    output: str = ""

    def passed(self) -> set[str]:
        return {t for t, o in self.tests.items() if o == "passed"}


def run_pytest(
    testbed: Path,
    python: str | Path,
    *,
    src_root: str = ".",
    files: list[str] | None = None,
    args: tuple[str, ...] | list[str] = (),
    timeout_sec: float = 120.0,
) -> PytestRun:
    """Run `python -m pytest [args] [files]` in `testbed`; `files` None runs what the config collects."""
    with tempfile.TemporaryDirectory(prefix="arl-swe-run-") as tmp:
        report = Path(tmp) / "report.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV", "PYTHON"))}
        env.update(
            ARL_SWE_REPORT=str(report),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONPATH=f"{TASK_FILES}:{(testbed / src_root).resolve()}",
        )
        # Pin the rootdir and config to the testbed's own: pytest would otherwise search the folders above
        # it (on the host, this project's own pyproject.toml) when the package ships no config.
        config = own_config(testbed)
        if config is None:
            config = Path(tmp) / "pytest.ini"
            config.write_text("[pytest]\n")
        # --confcutdir: with the empty config in tmp, pytest would also load the conftest.py files of the folders
        # above the testbed (this project's own, when the cache is under it).
        cmd = [
            str(python),
            "-m",
            "pytest",
            "-p",
            "arl_swe_report",
            "-p",
            "no:cacheprovider",
            "-q",
            "--tb=short",
            f"--rootdir={testbed.resolve()}",
            f"--confcutdir={testbed.resolve()}",
            "-c",
            str(config),
            *args,
            *(files or []),
        ]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=testbed,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        run = PytestRun()
        try:
            out, _ = proc.communicate(timeout=timeout_sec)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            run.timed_out = True
        run.seconds = time.monotonic() - start
        run.output = (out or "")[-20000:]
        if report.is_file():
            data = json.loads(report.read_text())
            run.tests = data["tests"]
            run.messages = data["messages"]
            run.collect_errors = data["collect_errors"]
            run.exitstatus = data["exitstatus"]
        return run
