"""pytest plugin of arl SWE tasks: records every test's outcome, by node id, in one JSON document.

Loaded with `-p arl_swe_report` (this file's folder on PYTHONPATH) by the task's tests/test.sh and by the
task-set builder, so both see the same node ids. A test counts as "passed" only when no phase failed;
collection errors are listed by the collector's node id. The document is written at session end, so a
missing one means pytest itself did not run to the end (the verifier's also streams each outcome first).

Where it goes: the builder (a trusted run) names a file in $ARL_SWE_REPORT. The verifier runs the agent's
code in this process, so there the report goes to a pipe the root grader reads ($ARL_SWE_REPORT_FD: no
seek, no truncate, only appends): one line per outcome as it is recorded, then one document carrying a
nonce the grader wrote into another pipe ($ARL_SWE_NONCE_FD), read and closed here before any code of the
repository is imported. A document forged by that code lacks the nonce; one written besides this one
makes two (score.py takes exactly one); outcomes changed in memory after they were streamed disagree with
the stream (score.py takes the stream and counts the difference as tampering).

What it watches (the verifier's run only): the runner's own functions and classes (`_pytest`, `pytest`,
`pluggy`, this plugin) as they were when this module was imported, before collection imported the
repository; an entry replaced or a function's code swapped since, or a hook implementation from a file
the agent changed ($ARL_SWE_CHANGE, grade_change.py's verdict) or from no file at all, is listed under
"tampered" and scores 0. So is the agent's code calling what reaches into the interpreter's own state
(frames, the garbage collector's object lists, raw memory through ctypes, trace functions), seen through
the interpreter's audit events. The recorder is held by no name of this module, is a tuple (its parts
cannot be rebound), and writes through functions taken at import; its pipe is checked before each write,
and a pipe closed or swapped under it ends the process with CHANNEL_ALARM. Code written against both this
plugin's and pluggy's internals can still silence the recorder and forge from inside the process; the
design note (docs/design/swe-grading.md) says so.
"""

from __future__ import annotations

import functools
import json
import operator
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
# The exit status of a run whose report pipe was closed or swapped under the recorder (test.sh scores it as
# runner_tampered).
CHANNEL_ALARM = 86
# Audit events of calls that reach into the interpreter's own state: from the agent's code, tampering.
_REACHING_EVENTS = frozenset(
    {
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
        "sys.settrace",
        "sys.setprofile",
        "ctypes.addressof",
        "ctypes.cdata",
        "ctypes.dlsym",
        "ctypes.string_at",
        "ctypes.wstring_at",
    }
)
# Attributes whose reading gives a frame (audited as object.__getattr__) or whose writing swaps code.
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


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


class _Origins(tuple):
    """Which code may replace a runner member: code from a file the change did not touch. pytest changes its
    own classes while it runs (its legacy-path plugin adds members at start); the agent's code comes from
    the files it changed, from a string (`<string>`), or is built by hand (`CodeType`, `code.replace`), which
    can claim any file name: every code object built so is remembered by its (file, name) and is foreign.

    Its audit hook also tells (through `channel`, at once) when the agent's code calls what reaches into the
    interpreter's state. A tuple, like the recorder: its parts cannot be rebound."""

    __slots__ = ()

    def __new__(cls, changed_files: frozenset[str], channel: _PipeChannel) -> _Origins:
        built: set[tuple[str, str]] = set()
        told: set[str] = set()
        self = tuple.__new__(cls, (changed_files, built, told, channel, type(channel).send, sys._getframe))
        sys.addaudithook(self._audit)
        return self

    def _audit(self, event: str, args: tuple) -> None:
        if event == "code.__new__" and len(args) > 2:  # (code, filename, name, ...)
            self[1].add((str(args[1]), str(args[2])))
        elif event in _REACHING_EVENTS or (
            event in ("object.__getattr__", "object.__setattr__")
            and len(args) > 1
            and (args[1] in _FRAME_ATTRIBUTES or (event == "object.__setattr__" and args[1] == "__code__"))
        ):
            # Only the direct caller counts: the runner and the standard library reach in for their own work.
            caller = self[5](1)
            if caller is not None and self.foreign(caller.f_code):
                what = f"the agent's code called {event}" + (f" {args[1]}" if event[0] == "o" else "")
                if what not in self[2]:
                    self[2].add(what)
                    self[4](self[3], json.dumps({"tampered": what}) + "\n")

    def foreign(self, code: types.CodeType, resolved: dict[str, bool] | None = None) -> bool:
        """Whether `code` is the agent's; `resolved` (one check's own) remembers each file's verdict."""
        name = code.co_filename
        if name.startswith("<") or (name, code.co_name) in self[1]:
            return True
        if resolved is None:
            return os.path.realpath(name) in self[0]
        if name not in resolved:
            resolved[name] = os.path.realpath(name) in self[0]
        return resolved[name]


class _RunnerSnapshot(tuple):
    """The runner's functions and classes (and each class's members) as loaded now, by identity."""

    __slots__ = ()

    def __new__(cls, origins: _Origins) -> _RunnerSnapshot:
        entries: list[tuple[object, str, str, object, object]] = []
        class_keys: list[tuple[type, frozenset[str]]] = []
        for module_name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType) or not _guarded(module_name):
                continue
            namespace = vars(module)
            for name, value in list(namespace.items()):
                if getattr(value, "__module__", None) != module_name:
                    continue
                if isinstance(value, types.FunctionType):
                    entries.append((namespace, f"{module_name}.{name}", name, value, value.__code__))
                elif isinstance(value, type):
                    entries.append((namespace, f"{module_name}.{name}", name, value, None))
                    members = vars(value)  # a live view: a change made by any route shows here
                    class_keys.append((value, frozenset(members)))
                    for member, held in list(members.items()):
                        entries.append(
                            (
                                members,
                                f"{module_name}.{value.__qualname__}.{member}",
                                member,
                                held,
                                _code_of(held),
                            )
                        )
        return tuple.__new__(cls, (origins, tuple(entries), tuple(class_keys)))

    def _foreign(self, value: object) -> bool:
        """A new value for a runner member that runs the agent's code (plain data is not code)."""
        code = _code_of(value)
        if code is None:
            return isinstance(value, type) and not _guarded(getattr(value, "__module__", ""))
        return self[0].foreign(code)

    def changes(self) -> list[str]:
        found = []
        for owner, label, name, value, code in self[1]:
            now = owner.get(name)  # type: ignore[attr-defined]
            if now is not value and self._foreign(now):
                found.append(f"{label} replaced")
            elif now is value and code is not None and _code_of(now) is not code and self._foreign(now):
                found.append(f"{label}: its code was swapped")
        for cls, keys in self[2]:
            members = vars(cls)
            added = sorted(k for k in set(members) - keys if self._foreign(members[k]))
            if added:
                found.append(f"{cls.__module__}.{cls.__qualname__}: {', '.join(added)} added")
        return found


class _PipeChannel(tuple):
    """The verifier's report pipe: its descriptor, what it is (device, inode) and the functions that write
    it, all taken at import, before the repository's code runs."""

    __slots__ = ()
    stream = True

    def __new__(cls, fd: int) -> _PipeChannel:
        st = os.fstat(fd)
        return tuple.__new__(cls, (fd, (st.st_dev, st.st_ino), os.write, os.fstat, os._exit))

    def send(self, text: str) -> None:
        fd, identity, write, fstat, exit_now = self
        try:
            st = fstat(fd)
            same = (st.st_dev, st.st_ino) == identity
        except OSError:
            same = False
        if not same:  # closed or swapped: nothing this process writes from now on can be trusted
            exit_now(CHANNEL_ALARM)
        data = text.encode()
        while data:
            data = data[write(fd, data) :]


class _FileChannel(tuple):
    """The builder's report file, written whole at the end (a trusted run: no stream)."""

    __slots__ = ()
    stream = False

    def __new__(cls, path: str | None) -> _FileChannel:
        return tuple.__new__(cls, (path,))

    def send(self, text: str) -> None:
        (path,) = self
        if path:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)


class _Recorder(tuple):
    """The outcomes of one pytest session. A tuple, compared and hashed by identity: code that reaches it can
    change the dicts it holds (the stream makes that worthless) but cannot rebind what it writes with, what it
    checks against or the nonce."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__

    def __new__(cls, channel, snapshot, origins, nonce):  # noqa: ANN001, ANN204
        # The last item: [config, time of the next check].
        return tuple.__new__(
            cls, (channel, type(channel).send, snapshot, origins, nonce, {}, {}, {}, [], [None, 0.0])
        )

    channel = property(operator.itemgetter(0))
    snapshot = property(operator.itemgetter(2))
    origins = property(operator.itemgetter(3))
    nonce = property(operator.itemgetter(4))
    outcomes = property(operator.itemgetter(5))
    messages = property(operator.itemgetter(6))
    collect_errors = property(operator.itemgetter(7))
    tampered = property(operator.itemgetter(8))
    _run = property(operator.itemgetter(9))

    def _send(self, text: str) -> None:
        self[1](self[0], text)

    def _merge(self, nodeid: str, outcome: str) -> None:
        # failed beats everything; passed needs the call phase; skipped stays unless something else happens.
        # score.py merges the stream by the same rule.
        if self[0].stream:
            self._send(json.dumps({"test": nodeid, "outcome": outcome}) + "\n")
        old = self.outcomes.get(nodeid)
        if old == "failed":
            return
        if outcome == "failed" or old is None or (old == "skipped" and outcome == "passed"):
            self.outcomes[nodeid] = outcome

    def _check(self, always: bool = False) -> None:
        started = _clock()
        if self.snapshot is None or (not always and started < self._run[1]):
            return
        for finding in self.snapshot.changes() + self._foreign_hooks():
            if finding not in self.tampered:
                self.tampered.append(finding)
                self._send(json.dumps({"tampered": finding}) + "\n")
        ended = _clock()
        self._run[1] = ended + CHECK_SPACING * (ended - started)

    def _foreign_hooks(self) -> list[str]:
        """Hook implementations from a file the agent changed, or from code compiled from no file."""
        config = self._run[0]
        if config is None or self.origins is None:
            return []
        found, resolved = [], {}
        for caller_name, caller in vars(config.pluginmanager.hook).items():
            for impl in getattr(caller, "get_hookimpls", lambda: [])():
                code = _code_of(impl.function)
                if code is None or self.origins.foreign(code, resolved):
                    found.append(f"hook {caller_name} implemented by the agent's code")
        return found

    def pytest_configure(self, config) -> None:  # noqa: ANN001 - pytest hook
        self._run[0] = config

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
        if self.nonce is not None:
            data.update(nonce=self.nonce, tampered=self.tampered)
        self._send(json.dumps(data) + ("\n" if self[0].stream else ""))


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


def _new_recorder() -> _Recorder:
    """The session's recorder, made while only the runner's code has run. A recorder without a nonce (the
    builder) trusts its run: no watch, and its report goes to a file."""
    nonce = _read_nonce()
    if nonce is None:
        return _Recorder(_FileChannel(os.environ.get("ARL_SWE_REPORT")), None, None, None)
    fd = _take_fd("ARL_SWE_REPORT_FD")
    if fd is None:
        raise RuntimeError("arl_swe_report: $ARL_SWE_NONCE_FD is set without $ARL_SWE_REPORT_FD")
    channel = _PipeChannel(fd)
    origins = _Origins(_changed_files(), channel)
    return _Recorder(channel, _RunnerSnapshot(origins), origins, nonce)


# Handed to pytest by the first hook it calls here, then held by pytest alone (no name of this module).
_pending = [_new_recorder()]


def pytest_addoption(parser, pluginmanager) -> None:  # noqa: ANN001 - pytest hook
    while _pending:
        pluginmanager.register(_pending.pop(), "arl-swe-recorder")
