"""pytest plugin of arl SWE tasks: writes every test's outcome, by node id, to $ARL_SWE_REPORT (JSON).

Loaded with `-p arl_swe_report` (this file's folder on PYTHONPATH) by the task's tests/test.sh and by the
task-set builder, so both see the same node ids. A test counts as "passed" only when no phase failed;
collection errors are listed by the collector's node id. The file is written at session end, so a
missing file means pytest itself did not run to the end.
"""

from __future__ import annotations

import json
import os

_outcomes: dict[str, str] = {}
_messages: dict[str, str] = {}
_collect_errors: dict[str, str] = {}
_MESSAGE_CHARS = 6000


def _merge(nodeid: str, outcome: str) -> None:
    # failed beats everything; passed needs the call phase; skipped stays unless something else happens.
    old = _outcomes.get(nodeid)
    if old == "failed":
        return
    if outcome == "failed" or old is None or (old == "skipped" and outcome == "passed"):
        _outcomes[nodeid] = outcome


def pytest_runtest_logreport(report):  # noqa: ANN001 - pytest hook
    if report.failed:
        _merge(report.nodeid, "failed")
        if report.nodeid not in _messages:
            _messages[report.nodeid] = report.longreprtext[-_MESSAGE_CHARS:]
    elif report.skipped:
        _merge(report.nodeid, "skipped")
    elif report.when == "call":
        _merge(report.nodeid, "passed")


def pytest_collectreport(report):  # noqa: ANN001 - pytest hook
    if report.failed:
        _collect_errors[report.nodeid] = report.longreprtext[-_MESSAGE_CHARS:]


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001 - pytest hook
    path = os.environ.get("ARL_SWE_REPORT")
    if not path:
        return
    data = {"exitstatus": int(exitstatus), "tests": _outcomes, "messages": _messages,
            "collect_errors": _collect_errors}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
