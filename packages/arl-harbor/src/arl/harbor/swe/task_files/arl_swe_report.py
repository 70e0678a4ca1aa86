"""pytest plugin of arl SWE tasks: records every test's outcome, by node id, as one JSON document.

Loaded with `-p arl_swe_report` (this file's folder on PYTHONPATH) by the task's tests/test.sh and by the
task-set builder, so both see the same node ids. A test counts as "passed" only when no phase failed;
collection errors are listed by the collector's node id. The document is written at session end, so a
missing one means pytest itself did not run to the end.

Where it goes: the builder (a trusted run) names a file in $ARL_SWE_REPORT. The verifier runs the agent's
code in this process, so there the document goes to a pipe the root grader reads ($ARL_SWE_REPORT_FD: no
seek, no truncate, only appends), and carries a nonce the grader wrote into another pipe
($ARL_SWE_NONCE_FD), read and closed here before any code of the repository is imported: a document
forged by that code lacks it, and one written besides this one makes two (score.py takes exactly one).

What it watches (the verifier's run only): the runner's own functions and classes (`_pytest`, `pytest`,
`pluggy`, this plugin) as they were when this module was imported, before collection imported the
repository; an entry replaced or a function's code swapped since, or a hook implementation from a file
the agent changed ($ARL_SWE_CHANGE, grade_change.py's verdict) or from no file at all, is listed under
"tampered" and scores 0. Code written against this plugin's internals can still reach its recorder and
forge from inside the process; the design note (docs/design/swe-grading.md) says so.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import types

_MESSAGE_CHARS = 6000
_GUARDED = ("_pytest", "pytest", "pluggy", "iniconfig", "arl_swe_report")
_CODE_HOLDERS = (classmethod, staticmethod)
# The watch's share of the run: after a check that took t seconds, the next waits CHECK_SPACING * t (a
# suite of 10,000 fast subtests would otherwise spend most of its time checking); the end always checks.
CHECK_SPACING = 20
_clock = time.perf_counter  # taken before the repository's code runs


def _guarded(module_name: str) -> bool:
    return any(
        module_name == p or module_name.startswith(p + ".") for p in _GUARDED
    ) or module_name.startswith("pytest_")


def _code_of(value: object) -> types.CodeType | None:
    """The code a member runs (through classmethod, staticmethod, property, partial, bound method)."""
    for _ in range(8):
        if isinstance(value, _CODE_HOLDERS):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        elif isinstance(value, functools.partial):
            value = value.func
        elif isinstance(value, types.MethodType):
            value = value.__func__
        else:
            break
    code = getattr(value, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


class _Origins:
    """Which code may replace a runner member: code from a file the change did not touch. pytest changes its
    own classes while it runs (its legacy-path plugin adds members at start); the agent's code comes from
    the files it changed, from a string (`<string>`), or is built by hand (`CodeType`, `code.replace`), which
    can claim any file name: every code object built so is remembered by its (file, name) and is foreign."""

    def __init__(self, changed_files: frozenset[str]) -> None:
        self.changed_files = changed_files
        self.built: set[tuple[str, str]] = set()
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple) -> None:
        if event == "code.__new__" and len(args) > 2:  # (code, filename, name, ...)
            self.built.add((str(args[1]), str(args[2])))

    def foreign(self, code: types.CodeType) -> bool:
        name = code.co_filename
        return (
            name.startswith("<")
            or (name, code.co_name) in self.built
            or os.path.realpath(name) in self.changed_files
        )


class _RunnerSnapshot:
    """The runner's functions and classes (and each class's members) as loaded now, by identity."""

    def __init__(self, origins: _Origins) -> None:
        self._origins = origins
        self._entries: list[tuple[object, str, str, object, object]] = []
        self._class_keys: list[tuple[type, frozenset[str]]] = []
        for module_name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType) or not _guarded(module_name):
                continue
            namespace = vars(module)
            for name, value in list(namespace.items()):
                if getattr(value, "__module__", None) != module_name:
                    continue
                if isinstance(value, types.FunctionType):
                    self._entries.append((namespace, f"{module_name}.{name}", name, value, value.__code__))
                elif isinstance(value, type):
                    self._entries.append((namespace, f"{module_name}.{name}", name, value, None))
                    members = vars(value)  # a live view: a change made by any route shows here
                    self._class_keys.append((value, frozenset(members)))
                    for member, held in list(members.items()):
                        self._entries.append(
                            (
                                members,
                                f"{module_name}.{value.__qualname__}.{member}",
                                member,
                                held,
                                _code_of(held),
                            )
                        )

    def _foreign(self, value: object) -> bool:
        """A new value for a runner member that runs the agent's code (plain data is not code)."""
        code = _code_of(value)
        if code is None:
            return isinstance(value, type) and not _guarded(getattr(value, "__module__", ""))
        return self._origins.foreign(code)

    def changes(self) -> list[str]:
        found = []
        for owner, label, name, value, code in self._entries:
            now = owner.get(name)  # type: ignore[attr-defined]
            if now is not value and self._foreign(now):
                found.append(f"{label} replaced")
            elif now is value and code is not None and _code_of(now) is not code and self._foreign(now):
                found.append(f"{label}: its code was swapped")
        for cls, keys in self._class_keys:
            members = vars(cls)
            added = sorted(k for k in set(members) - keys if self._foreign(members[k]))
            if added:
                found.append(f"{cls.__module__}.{cls.__qualname__}: {', '.join(added)} added")
        return found


class _Recorder:
    """The outcomes of one pytest session, written once at its end."""

    def __init__(self, snapshot: _RunnerSnapshot | None, origins: _Origins | None, nonce: str | None) -> None:
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.collect_errors: dict[str, str] = {}
        self.tampered: list[str] = []
        self._snapshot = snapshot
        self._origins = origins
        self._nonce = nonce
        self._config = None
        self._next_check = 0.0

    def _merge(self, nodeid: str, outcome: str) -> None:
        # failed beats everything; passed needs the call phase; skipped stays unless something else happens.
        old = self.outcomes.get(nodeid)
        if old == "failed":
            return
        if outcome == "failed" or old is None or (old == "skipped" and outcome == "passed"):
            self.outcomes[nodeid] = outcome

    def _check(self, always: bool = False) -> None:
        started = _clock()
        if self._snapshot is None or (not always and started < self._next_check):
            return
        found = self._snapshot.changes() + self._foreign_hooks()
        self.tampered += [f for f in found if f not in self.tampered]
        ended = _clock()
        self._next_check = ended + CHECK_SPACING * (ended - started)

    def _foreign_hooks(self) -> list[str]:
        """Hook implementations from a file the agent changed, or from code compiled from no file."""
        if self._config is None or self._origins is None:
            return []
        found = []
        for caller_name, caller in vars(self._config.pluginmanager.hook).items():
            for impl in getattr(caller, "get_hookimpls", lambda: [])():
                code = _code_of(impl.function)
                if code is None or self._origins.foreign(code):
                    found.append(f"hook {caller_name} implemented by the agent's code")
        return found

    def pytest_configure(self, config) -> None:  # noqa: ANN001 - pytest hook
        self._config = config

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 - pytest hook
        if report.failed:
            self._merge(report.nodeid, "failed")
            if report.nodeid not in self.messages:
                self.messages[report.nodeid] = report.longreprtext[-_MESSAGE_CHARS:]
        elif report.skipped:
            self._merge(report.nodeid, "skipped")
        elif report.when == "call":
            self._merge(report.nodeid, "passed")
            self._check()

    def pytest_collectreport(self, report) -> None:  # noqa: ANN001 - pytest hook
        if report.failed:
            self.collect_errors[report.nodeid] = report.longreprtext[-_MESSAGE_CHARS:]

    def pytest_sessionfinish(self, session, exitstatus) -> None:  # noqa: ANN001 - pytest hook
        self._check(always=True)
        data = {
            "exitstatus": int(exitstatus),
            "tests": self.outcomes,
            "messages": self.messages,
            "collect_errors": self.collect_errors,
        }
        if self._nonce is not None:
            data.update(nonce=self._nonce, tampered=self.tampered)
        _write(json.dumps(data))


def _take_fd(variable: str) -> int | None:
    value = os.environ.pop(variable, None)
    return int(value) if value else None


def _read_nonce() -> str | None:
    fd = _take_fd("ARL_SWE_NONCE_FD")
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read(256).decode("ascii", "replace").strip()


def _changed_files() -> frozenset[str]:
    path, root = os.environ.pop("ARL_SWE_CHANGE", None), os.environ.pop("ARL_SWE_TESTBED_ROOT", None)
    if not path or not root:
        return frozenset()
    with open(path) as f:
        kept = json.load(f).get("kept", [])
    return frozenset(os.path.realpath(os.path.join(root, rel)) for rel in kept)


def _writer():
    fd, path = _take_fd("ARL_SWE_REPORT_FD"), os.environ.get("ARL_SWE_REPORT")

    def write(text: str) -> None:
        if fd is not None:
            with os.fdopen(fd, "w") as pipe:
                pipe.write(text)
        elif path:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)

    return write


def _recorder_plugin():
    """This module's one hook: registers the session's recorder, which no name of this module holds."""
    nonce = _read_nonce()
    origins = _Origins(_changed_files()) if nonce is not None else None
    # Taken now, while only the runner's code has run; a recorder without a nonce (the builder) trusts its run.
    recorder = _Recorder(_RunnerSnapshot(origins), origins, nonce) if origins else _Recorder(None, None, None)

    def pytest_configure(config) -> None:  # noqa: ANN001 - pytest hook
        config.pluginmanager.register(recorder, "arl-swe-recorder")

    return pytest_configure


_write = _writer()
pytest_configure = _recorder_plugin()
