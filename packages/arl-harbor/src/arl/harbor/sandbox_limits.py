"""CPU, memory and process-count limits of one local sandbox: cgroups where this host allows, else rlimits.

`SandboxLimits.create` makes one cgroup per trial (cgroup v2 when `/sys/fs/cgroup` is a v2 hierarchy
whose subtree we may write, else the v1 `memory`, `pids` and `cpu` hierarchies where `mkdir` works)
and writes the task's limits there; `join_argv` is the host-side prefix that moves a command into that
cgroup before it enters the sandbox (`nsenter`ed processes do not inherit the sandbox init's cgroup).
`rlimit_argv` (a `prlimit` prefix run inside the sandbox) always caps the process count (a fork bomb)
and, when no memory cgroup exists, each process's address space. `destroy` removes the cgroups once
the sandbox's processes are gone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import msgspec

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CPU_PERIOD_US = 100_000


class SandboxLimits(msgspec.Struct, kw_only=True):
    """What one sandbox may use, and where that is enforced."""

    cpus: float | None = None
    memory_mb: int | None = None
    # Processes (threads included) the sandbox may hold at once.
    max_processes: int = 1024
    # Cgroup directories created for this sandbox (empty: rlimits only).
    cgroups: list[str] = msgspec.field(default_factory=list)
    # "cgroup2", "cgroup1" or "rlimit": where the memory limit is enforced.
    memory_enforced_by: str = "rlimit"
    cpu_enforced_by: str = "none"

    @classmethod
    def create(
        cls, name: str, *, cpus: float | None, memory_mb: int | None, max_processes: int
    ) -> SandboxLimits:
        """Limits for sandbox `name`, in a fresh cgroup when the host lets us make one."""
        limits = cls(cpus=cpus, memory_mb=memory_mb, max_processes=max_processes)
        if os.geteuid() != 0:
            return limits
        if (_CGROUP_ROOT / "cgroup.controllers").is_file():
            limits._create_v2(name)
        else:
            limits._create_v1(name)
        return limits

    def _create_v2(self, name: str) -> None:
        parent = _CGROUP_ROOT / Path(_own_cgroup("")).relative_to("/")
        group = parent / f"arl-{name}"
        try:
            group.mkdir()
        except OSError:
            return
        self.cgroups.append(str(group))
        if self.memory_mb and _write(group / "memory.max", str(self.memory_mb << 20)):
            _write(group / "memory.swap.max", "0")
            self.memory_enforced_by = "cgroup2"
        if self.cpus and _write(group / "cpu.max", f"{int(self.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}"):
            self.cpu_enforced_by = "cgroup2"
        _write(group / "pids.max", str(self.max_processes))

    def _create_v1(self, name: str) -> None:
        for controller in ("memory", "pids", "cpu"):
            root = _CGROUP_ROOT / controller
            if not root.is_dir():
                continue
            own = root / Path(_own_cgroup(controller)).relative_to("/")
            group = (own if own.is_dir() else root) / f"arl-{name}"  # nested under ours: our limits hold too
            try:
                group.mkdir()
            except OSError:
                continue
            self.cgroups.append(str(group))
            if controller == "memory" and self.memory_mb:
                if _write(group / "memory.limit_in_bytes", str(self.memory_mb << 20)):
                    _write(group / "memory.memsw.limit_in_bytes", str(self.memory_mb << 20))
                    self.memory_enforced_by = "cgroup1"
            elif controller == "pids":
                _write(group / "pids.max", str(self.max_processes))
            elif controller == "cpu" and self.cpus:
                if _write(group / "cpu.cfs_period_us", str(_CPU_PERIOD_US)) and _write(
                    group / "cpu.cfs_quota_us", str(int(self.cpus * _CPU_PERIOD_US))
                ):
                    self.cpu_enforced_by = "cgroup1"

    def join_argv(self) -> list[str]:
        """Host-side prefix: move the process into every cgroup, then exec the rest of argv."""
        if not self.cgroups:
            return []
        joins = " && ".join(f"echo 0 > {group}/cgroup.procs" for group in self.cgroups)
        return ["/bin/sh", "-c", f'{joins} && exec "$0" "$@"']

    def rlimit_argv(self) -> list[str]:
        """Sandbox-side prefix: `prlimit` with the process cap (and memory when no cgroup holds it)."""
        argv = ["prlimit", f"--nproc={self.max_processes}:{self.max_processes}"]
        if self.memory_mb and self.memory_enforced_by == "rlimit":
            size = self.memory_mb << 20
            argv.append(f"--as={size}:{size}")
        return [*argv, "--"]

    def destroy(self, timeout_s: float = 5.0) -> None:
        """Remove the cgroups (waiting briefly for the killed processes to leave them)."""
        deadline = time.monotonic() + timeout_s
        for group in self.cgroups:
            while True:
                try:
                    os.rmdir(group)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    with contextlib.suppress(OSError):
                        for pid in Path(group, "cgroup.procs").read_text().split():
                            with contextlib.suppress(ProcessLookupError, ValueError):
                                os.kill(int(pid), 9)
                    time.sleep(0.05)
        self.cgroups = []


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path in the hierarchy of `controller` ("" = the v2 unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == controller or controller in controllers.split(","):
            return path or "/"
    return "/"


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True
