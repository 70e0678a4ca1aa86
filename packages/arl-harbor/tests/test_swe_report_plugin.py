"""The SWE report plugin in the verifier's mode (report and nonce through pipes, the runner watched), run
on a small repository in a real pytest process: a clean run reports no tampering, each way of forging from
inside the process that the plugin watches is reported, a forged document is refused by score.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arl.harbor.agents import attacks
from arl.harbor.swe.writer import TASK_FILES

NONCE = "0123456789abcdef0123456789abcdef"
TESTS = "import pkg\n\n\ndef test_fail():\n    assert pkg.VALUE == 2\n\n\ndef test_ok():\n    assert True\n"


def _run(repo: Path, init: str) -> dict:
    """pytest over `repo` (pkg/__init__.py = `init`, changed by the agent) as test.sh runs it; the document
    the plugin wrote to its pipe."""
    (repo / "pkg").mkdir(exist_ok=True)
    (repo / "pkg" / "__init__.py").write_text("VALUE = 1\n" + init)
    (repo / "test_pkg.py").write_text(TESTS)
    (repo / "change.json").write_text(json.dumps({"kept": ["pkg/__init__.py"]}))
    (repo / "pytest.ini").write_text("[pytest]\n")
    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, NONCE.encode())
    os.close(nonce_write)
    report_read, report_write = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ARL_SWE"))}
    env.update(
        ARL_SWE_NONCE_FD=str(nonce_read),
        ARL_SWE_REPORT_FD=str(report_write),
        ARL_SWE_CHANGE=str(repo / "change.json"),
        ARL_SWE_TESTBED_ROOT=str(repo),
        PYTHONPATH=f"{TASK_FILES}:{repo}",
        PYTHONDONTWRITEBYTECODE="1",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "pytest",
            "-p",
            "arl_swe_report",
            "-p",
            "no:cacheprovider",
            f"--rootdir={repo}",
            "-c",
            str(repo / "pytest.ini"),
            "-q",
            "test_pkg.py",
        ],
        cwd=repo,
        env=env,
        pass_fds=(nonce_read, report_write),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(nonce_read)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as pipe:
        raw = pipe.read()
    proc.wait(timeout=120)
    (repo / "report.json").write_bytes(raw)
    return json.loads(raw)


def _forgery(code: str) -> str:
    return code.replace("__NAMES__", repr({"test_fail"}))


def test_a_clean_run_reports_its_outcomes_with_the_nonce_and_no_tampering(tmp_path):
    data = _run(tmp_path, "")
    assert data["nonce"] == NONCE and data["tampered"] == []
    assert data["tests"] == {"test_pkg.py::test_fail": "failed", "test_pkg.py::test_ok": "passed"}


@pytest.mark.parametrize(
    ("forgery", "seen"),
    [
        (attacks._OBFUSCATED, "_pytest.reports.TestReport.from_item_and_call replaced"),
        (attacks._OBFUSCATED_MODULE_FUNCTION, "_pytest.runner.call_and_report replaced"),
        (attacks._OBFUSCATED_HOOK, "hook pytest_runtest_logreport implemented by the agent's code"),
        (
            "import types as _t\nVALUE = 2\n_t.FunctionType((lambda: 0).__code__.replace(co_filename='/x.py'), {})\n"
            "import _pytest.runner as _r\n_r.show_test_item = _t.FunctionType("
            "(lambda item: None).__code__.replace(co_filename=_r.__file__, co_name='<lambda>'), {})\n",
            "_pytest.runner.show_test_item replaced",
        ),
    ],
    ids=["class-member", "module-function", "registered-hook", "code-built-under-the-runners-name"],
)
def test_forgery_from_inside_the_process_is_reported(tmp_path, forgery, seen):
    data = _run(tmp_path, _forgery(forgery))
    assert seen in data["tampered"], data["tampered"]


def test_score_takes_only_one_document_with_the_runs_nonce(tmp_path):
    score = TASK_FILES / "score.py"
    _run(tmp_path, "")
    source, dest = tmp_path / "report.json", tmp_path / "taken.json"

    def take(nonce: str) -> int:
        return subprocess.run(
            [sys.executable, "-I", str(score), "--take-report", str(source), str(dest), nonce]
        ).returncode

    assert take(NONCE) == 0 and json.loads(dest.read_text())["nonce"] == NONCE
    assert take("f" * 32) == 1  # a document without the run's nonce is a forgery
    source.write_text(source.read_text() + json.dumps({"tests": {}, "nonce": NONCE, "tampered": []}))
    assert take(NONCE) == 1  # a second document beside the plugin's
