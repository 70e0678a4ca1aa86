"""A Harbor environment that runs a trial's sandbox as namespaced local processes, for machines without Docker.

The sandbox is a boundary, built from what Linux offers root without Docker:
- Its own root: a size-limited tmpfs (inside the trial's directory, in a private mount namespace) holding
  read-only binds of the host's system dirs (`/usr`, `/etc`, `/opt`, the `/bin`-style links), fresh
  per-trial dirs for the workdir, `/logs/*`, `/tests`, `/solution`, `/tmp` and `/root`, a read-only
  `/proc` of its own PID namespace, a read-only `/sys`, and a minimal `/dev` (null, zero, random, tty, its
  own devpts for tmux). `pivot_root` leaves nothing else visible: not the host's files, not the task's
  `solution/` or `tests/` (Harbor uploads tests only for the verifier, the solution only for the oracle).
- A user namespace: root inside is an unprivileged host uid (a per-trial range), so it cannot remount,
  write `/proc`/`/sys`, or touch host files; the mounts belong to the host's namespace and cannot be
  changed from inside.
- Its own network namespace with only loopback; names resolve through a recorder that refuses every
  query and logs it (`arl.harbor.sandbox_net`), so a verifier that needs the network fails loudly.
  Explicit opt-in: `routes` (sandbox loopback ports forwarded to host addresses) or `network="host"`.
- cpu/memory/process limits from the task (`arl.harbor.sandbox_limits`: cgroups where writable, else
  rlimits); all processes die with the PID namespace at `stop`.

Each `exec` enters the namespaces with `nsenter` and runs `bash -c` there, so a tmux server started by
one exec is reachable by the next. The "image" is the host's installed system; the task's Dockerfile is
not built, but what it says is honoured as far as a host can: its `COPY`/`ADD` of local files are
copied to the same places (relative to its `WORKDIR`s), its `ENV` variables are set in every exec,
`environment/local_binds.json` binds prepared
host dirs read-only (e.g. a package's test venv), and `environment/local_setup.sh` stands in for its
`RUN` steps. A Dockerfile with `RUN` steps and no such script fails the start (`SandboxTaskError`, a
task the sandbox cannot run as defined) instead of running the task in an unprepared system. Select it
with `EnvironmentConfig(import_path="arl.harbor.environment:LocalSandboxEnvironment")`.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import pwd
import random
import re
import shlex
import shutil
import signal
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities

from arl.harbor.agent_end import leftover_commands, write_agent_end
from arl.harbor.carry import carry_filter, carry_limit_bytes, refuse_carry
from arl.harbor.errors import SandboxError, SandboxExecTimeoutError, SandboxStartError, SandboxTaskError
from arl.harbor.sandbox_limits import SandboxLimits
from arl.harbor.sandbox_net import SandboxNetwork, parse_routes

_READY = "__ARL_SANDBOX_READY__"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Sandbox paths that always get a fresh per-trial directory (the workdir is added per task).
_BASE_TARGETS = ("/logs", "/tests", "/solution", "/root")
# Host system dirs bound read-only into the sandbox's root (symlinks, e.g. merged /usr, are copied).
DEFAULT_SYSTEM_DIRS = ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
# Inner uids 0..65535 map to host uids base..base+65535; the base is picked per trial in this range.
_UID_RANGE = 65536
_UID_BASE_SLOTS = (2, 30000)
# The file (in the trial dir) where blocked DNS lookups are recorded; read by the trial loop.
NETWORK_LOG_NAME = "arl_sandbox_network.jsonl"
# After a command exits, how long to wait for its output pipes to close (background children may
# keep them open; Docker also returns when the command itself exits).
_PIPE_DRAIN_SEC = 2.0


def _dockerfile_workdir(environment_dir: Path) -> str | None:
    """The last absolute WORKDIR of the task's Dockerfile, if any (the rest of it is not built)."""
    dockerfile = environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        return None
    workdir = None
    for line in dockerfile.read_text(errors="replace").splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR" and parts[1].startswith("/"):
            workdir = parts[1].strip().strip("\"'")
    return workdir


def _dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, line continuations joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text(errors="replace").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            name, _, args = line.partition(" ")
            instructions.append((name.upper(), args.strip()))
    if pending.strip():
        name, _, args = pending.strip().partition(" ")
        instructions.append((name.upper(), args.strip()))
    return instructions


def _copy_arguments(args: str) -> tuple[list[str], str] | None:
    """(sources, destination) of a COPY/ADD, or None when it does not copy from the build context."""
    rest = args.strip()
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        if flag.startswith("--from"):
            return None  # from another stage or image: nothing the host has
        rest = rest.lstrip()
    try:
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    except ValueError as e:
        raise SandboxTaskError(f"cannot parse the Dockerfile's COPY/ADD arguments {args!r}: {e}") from None
    if len(words) < 2:
        return None
    sources, dest = words[:-1], words[-1]
    if any("://" in src for src in sources):
        return None  # ADD <url>: needs the network
    return sources, dest


def _env_assignments(args: str, env: dict[str, str]) -> dict[str, str]:
    """The variables of an ENV instruction (`K=V ...` or legacy `K V`), `$K`/`${K}` expanded as docker does."""

    def expand(value: str) -> str:
        return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), value)

    try:
        words = shlex.split(args)
    except ValueError as e:
        raise SandboxTaskError(f"cannot parse the Dockerfile's ENV {args!r}: {e}") from None
    if words and "=" not in words[0]:
        return {words[0]: expand(" ".join(words[1:]))}
    return {k: expand(v) for k, _, v in (w.partition("=") for w in words)}


def dockerfile_plan(
    environment_dir: Path, base_env: dict[str, str] | None = None
) -> tuple[list[tuple[Path, str, bool]], list[str], dict[str, str]]:
    """What the local sandbox does for `environment_dir/Dockerfile`: (copies, run steps, env).

    copies: (host source, sandbox destination, destination is a directory) for each COPY/ADD of local
    files, destinations resolved against the WORKDIR in effect; run steps: the RUN instructions, which
    the sandbox does not execute (`local_setup.sh` stands in for them); env: the variables its ENV
    instructions set (expanded over `base_env`), which every exec in the sandbox gets, as in the image.
    """
    dockerfile = environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        return [], [], {}
    copies: list[tuple[Path, str, bool]] = []
    runs: list[str] = []
    env: dict[str, str] = {}
    scope = dict(base_env or {})
    workdir = PurePosixPath("/")
    context = environment_dir.resolve()
    for name, args in _dockerfile_instructions(dockerfile):
        if name == "FROM":
            workdir = PurePosixPath("/")
        elif name == "WORKDIR" and args:
            workdir = workdir / args.strip().strip("\"'")
        elif name == "RUN":
            runs.append(args)
        elif name == "ENV" and args:
            assigned = _env_assignments(args, scope)
            env.update(assigned)
            scope.update(assigned)
        elif name in ("COPY", "ADD"):
            parsed = _copy_arguments(args)
            if parsed is None:
                continue
            sources, dest = parsed
            into_dir = dest.endswith("/") or len(sources) > 1
            target = str(workdir / dest)
            for pattern in sources:
                matches = sorted(glob.glob(str(context / pattern))) or []
                for match in matches:
                    src = Path(match).resolve()
                    if not src.is_relative_to(context):
                        raise SandboxTaskError(
                            f"Dockerfile {name} source {pattern!r} is outside the build context"
                        )
                    if src.is_dir():
                        copies.append((src, target, True))
                    else:
                        copies.append(
                            (src, str(PurePosixPath(target) / src.name) if into_dir else target, False)
                        )
    return copies, runs, env


LOCAL_BINDS_FILE = "local_binds.json"


def local_binds(environment_dir: Path) -> dict[str, Path]:
    """`environment/local_binds.json`: sandbox path -> host dir (absolute, or relative to environment/)."""
    path = environment_dir / LOCAL_BINDS_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SandboxTaskError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise SandboxTaskError(f"{path} must be an object {{sandbox path: host path}}")
    binds: dict[str, Path] = {}
    for inner, host in raw.items():
        if (
            not isinstance(inner, str)
            or not inner.startswith("/")
            or inner == "/"
            or not isinstance(host, str)
        ):
            raise SandboxTaskError(
                f"{path}: {inner!r} -> {host!r}: keys must be absolute sandbox paths, values paths"
            )
        source = (environment_dir / host).resolve()
        if not source.exists():
            raise SandboxTaskError(f"{path}: the host path {str(source)!r} bound on {inner} does not exist")
        top = PurePosixPath(inner).parts[1]
        if top in DEFAULT_SYSTEM_DIRS or top in ("proc", "sys", "dev", "logs", "tests", "solution"):
            raise SandboxTaskError(
                f"{path}: {inner} is under /{top}, which the sandbox binds from the host or manages itself; "
                "bind prepared dirs elsewhere (e.g. /arl/venv)"
            )
        binds[str(PurePosixPath(inner))] = source
    return binds


def _namespaces(pid: int) -> tuple[str, ...]:
    """The PID and user namespaces of `pid` (a nested PID namespace stays in the sandbox's user one)."""
    out = []
    for kind in ("pid", "user"):
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/ns/{kind}"))
    return tuple(out)


@contextlib.contextmanager
def pinned_namespaces(pid: int, pidfd: int) -> Iterator[tuple[str, ...]]:
    """The PID and user namespaces of the live process `pid` (held by `pidfd`), kept open while in use.

    Processes are matched to a sandbox by their namespaces' names (`pid:[inode]`), and the kernel gives a
    freed namespace's inode number to the next namespace made, within a second (measured). A stop that
    still matched by name after its sandbox's namespaces were freed would kill a sandbox starting beside
    it (seen as `unshare: sigprocmask unblock failed` or `sandbox init process not found` at its start).
    An open namespace file keeps the namespace, and so its number, alive. Empty if `pid` has ended.
    """
    fds: list[int] = []
    try:
        for kind in ("pid", "user"):
            with contextlib.suppress(OSError):
                fds.append(os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
        try:
            signal.pidfd_send_signal(pidfd, 0)  # still that process: the namespaces opened are its own
            names = tuple(os.readlink(f"/proc/self/fd/{fd}") for fd in fds)
        except ProcessLookupError:
            names = ()
        yield names
    finally:
        for fd in fds:
            os.close(fd)


def _processes_in(namespaces: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every host process in one of `namespaces`."""
    found = []
    own = set(_namespaces(os.getpid()))
    wanted = set(namespaces) - own  # never this process's own namespaces (a sandbox that never unshared)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if not wanted.intersection(_namespaces(int(entry.name))):
                continue
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        try:
            cmdline = (
                Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            )
        except OSError:
            cmdline = ""
        command = cmdline or stat[stat.index("(") + 1 : stat.rindex(")")]
        found.append((int(entry.name), int(stat.rsplit(")", 1)[1].split()[1]), command))
    return found


def _kill_if_in(pid: int, namespaces: tuple[str, ...]) -> None:
    """SIGKILL `pid` if it is (still) in one of `namespaces`: checked through a pidfd, so a PID that a new
    process took since the scan (another sandbox starting) is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    try:
        if set(_namespaces(pid)) & set(namespaces):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


class LocalSandboxEnvironment(BaseEnvironment):
    """Runs a Harbor trial's sandbox as namespaced local processes (see the module docstring).

    Constructor kwargs (from `EnvironmentConfig.kwargs`), besides Harbor's own:
      network: "none" (default: loopback only, DNS recorded and refused) or "host" (explicit opt-in:
        share the host's network, loopback services included).
      routes: opt-in TCP routes into the isolated network, "PORT" or "PORT=HOST:PORT": the sandbox's
        127.0.0.1:PORT reaches that host address (e.g. the arl proxy for agents that run inside).
      cpus, memory_mb: limits when the task sets none (the task's [environment] values, or Harbor's
        override_cpus/override_memory_mb, win).
      max_processes: processes the sandbox may hold at once (default 1024; a fork bomb stops there).
      system_dirs: host dirs bound read-only at the same path (default DEFAULT_SYSTEM_DIRS).
      root_size_mb: size of the writable tmpfs root (default 512).
      setup_script: file in the task's environment/ dir run as (sandbox) root in the workdir at start,
        standing in for the Dockerfile's RUN steps (default "local_setup.sh"; skipped when absent). A
        non-zero exit fails the start (SandboxStartError).
      extra_writable_dirs: more absolute sandbox paths that get a fresh writable per-trial directory.
      sandbox_root: host directory for the per-trial directories (default <trial_dir>/sandbox).
      path: PATH inside the sandbox (default the usual Debian PATH, not the caller's virtualenv).
      ready_timeout_sec: how long the namespace setup may take (default 30).
      auto_mounting: bind the trial's log dirs straight onto /logs/* (default True: no log copying).
      dockerfile_run: "fail" (default) or "ignore": what to do with a Dockerfile whose RUN steps no
        setup script stands in for ("fail": SandboxTaskError naming them; "ignore": run without them).
    """

    def __init__(
        self,
        *args: Any,
        network: str = "none",
        routes: Sequence[str] = (),
        cpus: float | None = None,
        memory_mb: int | None = None,
        max_processes: int = 1024,
        system_dirs: Sequence[str] = DEFAULT_SYSTEM_DIRS,
        root_size_mb: int = 512,
        setup_script: str | None = "local_setup.sh",
        extra_writable_dirs: Sequence[str] = (),
        sandbox_root: str | None = None,
        path: str = _DEFAULT_PATH,
        ready_timeout_sec: float = 30.0,
        auto_mounting: bool = True,
        dockerfile_run: str = "fail",
        **kwargs: Any,
    ) -> None:
        if dockerfile_run not in ("fail", "ignore"):
            raise SandboxError(f"dockerfile_run must be 'fail' or 'ignore', got {dockerfile_run!r}")
        self._dockerfile_run = dockerfile_run
        if network not in ("none", "host"):
            raise SandboxError(f"network must be 'none' or 'host', got {network!r}")
        self._network = network
        try:
            self._routes = parse_routes(list(routes))
        except ValueError as e:
            raise SandboxError(str(e)) from None
        if self._routes and network == "host":
            raise SandboxError(
                "routes apply to network='none' only (with 'host' the host is reachable anyway)"
            )
        self._default_cpus = cpus
        self._default_memory_mb = memory_mb
        self._max_processes = int(max_processes)
        self._system_dirs = [d.strip("/") for d in system_dirs]
        self._root_size_mb = int(root_size_mb)
        self._setup_script = setup_script
        self._extra_dirs = [str(PurePosixPath(d)) for d in extra_writable_dirs]
        self._path = path
        self._ready_timeout_sec = float(ready_timeout_sec)
        self._binds: dict[str, Path] = {}
        self._image_env: dict[str, str] = {}
        self._holder: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._init_pidfd: int | None = None
        self._limits: SandboxLimits | None = None
        self._net: SandboxNetwork | None = None
        self._uid_base = _UID_RANGE * random.randrange(*_UID_BASE_SLOTS)
        super().__init__(*args, auto_mounting=auto_mounting, **kwargs)
        # A separate verifier's environment (session "<trial>__verifier__<key>") gets dirs of its own.
        _, verifier, key = self.session_id.partition("__verifier__")
        default_root = self.trial_paths.trial_dir / (
            "sandbox" if not verifier else "sandbox-verifier-" + re.sub(r"[^A-Za-z0-9._-]", "_", key)[:40]
        )
        self._sandbox_root = (Path(sandbox_root) if sandbox_root else default_root).absolute()
        self._workdir = str(
            PurePosixPath(self.task_env_config.workdir or _dockerfile_workdir(self.environment_dir) or "/app")
        )
        if not self._workdir.startswith("/") or self._workdir == "/":
            raise SandboxError(f"workdir must be an absolute path other than '/', got {self._workdir!r}")

    @staticmethod
    def type() -> str:
        return "arl-local-sandbox"

    @classmethod
    def preflight(cls, **kwargs: Any) -> None:
        """Raise SandboxError when this host cannot run the sandbox (called by the app at start)."""
        if os.geteuid() != 0:
            raise SandboxError("LocalSandboxEnvironment must run as root (namespaces, mounts, uid maps)")
        for tool in ("unshare", "nsenter", "bash", "pivot_root", "prlimit", "setpriv", "mount"):
            if shutil.which(tool) is None:
                raise SandboxError(f"LocalSandboxEnvironment needs {tool!r} on PATH")
        network = kwargs.get("network", "none")
        if network not in ("none", "host"):
            raise SandboxError(f"network must be 'none' or 'host', got {network!r}")
        parse_routes(list(kwargs.get("routes", ())))

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # mounted: log dirs are bind-mounted from the trial dir; disable_internet: no network by default.
        return EnvironmentCapabilities(mounted=True, disable_internet=True)

    def _validate_definition(self) -> None:
        try:
            self.preflight(network=self._network)
        except SandboxError as e:
            raise SandboxError(str(e)) from None
        for name in ("Dockerfile", "docker-compose.yaml"):
            if (self.environment_dir / name).exists():
                self.logger.debug(
                    f"LocalSandboxEnvironment does not build environment/{name}; the sandbox's system is the "
                    "host's, read-only (provide environment/local_setup.sh for setup steps)"
                )

    # -- lifecycle -------------------------------------------------------------------------------

    def _sandbox_dirs(self) -> dict[str, Path]:
        """Sandbox path -> fresh per-trial host directory bound onto it."""
        targets = [self._workdir, *_BASE_TARGETS, *self._extra_dirs, "/tmp"]
        dirs: dict[str, Path] = {}
        for target in dict.fromkeys(targets):
            name = re.sub(r"[^A-Za-z0-9._-]", "_", target.strip("/")) or "root"
            dirs[target] = self._sandbox_root / "dirs" / name
        return dirs

    @property
    def _rootfs(self) -> Path:
        return self._sandbox_root / "rootfs"

    def _is_verifier_image(self) -> bool:
        """True for a separate verifier's environment whose image Harbor builds from the task's tests/."""
        env_dir = self.environment_dir
        return env_dir.name == "tests" and (env_dir.parent / "task.toml").is_file()

    def _setup_script_text(self, dirs: dict[str, Path]) -> str:
        q = shlex.quote
        r = q(str(self._rootfs))
        base = self._uid_base
        lines = [
            "set -e",
            f"mount -t tmpfs -o mode=755,uid={base},gid={base},size={self._root_size_mb}m arl-sandbox-root {r}",
        ]
        # A system dir inside a per-trial dir (a venv under /tmp/...) is bound after that dir, not hidden by it.
        nested = [d for d in self._system_dirs if any(f"/{d}".startswith(t.rstrip("/") + "/") for t in dirs)]

        def bind_system_dir(d: str) -> None:
            host, inner = f"/{d}", f"{self._rootfs}/{d}"
            if os.path.islink(host):
                lines.append(f"ln -s {q(os.readlink(host))} {q(inner)}")
            elif os.path.isdir(host):
                lines.append(f"mkdir -p {q(inner)} && mount --rbind {q(host)} {q(inner)}")
                lines.append(f"mount -o remount,bind,ro,nosuid,nodev {q(inner)}")

        for d in self._system_dirs:
            if d not in nested:
                bind_system_dir(d)
        # Our own resolv.conf: every lookup goes to the recorder on the sandbox's loopback.
        if (
            self._network == "none"
            and os.path.isfile("/etc/resolv.conf")
            and not os.path.islink("/etc/resolv.conf")
        ):
            resolv = self._sandbox_root / "resolv.conf"
            lines.append(f"mount --bind {q(str(resolv))} {r}/etc/resolv.conf")
        for target, source in dirs.items():
            inner = f"{self._rootfs}{target}"
            lines.append(f"mkdir -p {q(inner)} && mount --bind {q(str(source))} {q(inner)}")
        for d in nested:
            bind_system_dir(d)
        for mount in self._host_mounts:
            if mount.get("type") != "bind":
                raise SandboxStartError(f"LocalSandboxEnvironment supports bind mounts only, got {mount}")
            inner = f"{self._rootfs}{mount['target']}"
            lines.append(f"mkdir -p {q(inner)} && mount --bind {q(str(mount['source']))} {q(inner)}")
            if mount.get("read_only"):
                lines.append(f"mount -o remount,bind,ro {q(inner)}")
        for target, source in self._binds.items():  # environment/local_binds.json, read-only
            inner = f"{self._rootfs}{target}"
            make = "mkdir -p" if source.is_dir() else "mkdir -p $(dirname " + q(inner) + ") && touch"
            lines.append(f"{make} {q(inner)} && mount --bind {q(str(source))} {q(inner)}")
            lines.append(f"mount -o remount,bind,ro,nosuid,nodev {q(inner)}")
        lines += [
            f"mkdir -p {r}/proc {r}/sys {r}/dev",
            f"mount -t proc -o ro,nosuid,nodev,noexec proc {r}/proc",
            f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {r}/sys",
            f"mount -t tmpfs -o mode=755,nosuid,size=1m arl-sandbox-dev {r}/dev",
        ]
        for node in _DEV_NODES:
            lines.append(f"touch {r}/dev/{node} && mount --bind /dev/{node} {r}/dev/{node}")
        lines += [
            f"mkdir {r}/dev/pts {r}/dev/shm",
            f"mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts {r}/dev/pts",
            f"ln -s pts/ptmx {r}/dev/ptmx && ln -s /proc/self/fd {r}/dev/fd",
            f"ln -s /proc/self/fd/0 {r}/dev/stdin && ln -s /proc/self/fd/1 {r}/dev/stdout"
            f" && ln -s /proc/self/fd/2 {r}/dev/stderr",
            f"mount -t tmpfs -o mode=1777,nosuid,nodev,size=64m,uid={base},gid={base} arl-sandbox-shm {r}/dev/shm",
        ]
        if self._network == "none":
            lines.append("ip link set lo up")
        lines += [
            "hostname arl-sandbox",  # the same prompt in every trial (a group renders one first prompt)
            f"cd {r} && mkdir .oldroot && pivot_root . .oldroot && cd /",
            "umount -l /.oldroot && rmdir /.oldroot",
            f"echo {_READY}",
            # PID 1 of the sandbox: a new user namespace whose uid map the host writes next.
            "exec unshare --user -- sleep infinity",
        ]
        return "\n".join(lines)

    def _prepare_host_dirs(self, dirs: dict[str, Path]) -> None:
        base = self._uid_base
        self._rootfs.mkdir(parents=True, exist_ok=True)
        for target, source in dirs.items():
            source.mkdir(parents=True, exist_ok=True)
            os.chown(source, base, base)  # owned by the sandbox's root
            source.chmod(0o1777 if target == "/tmp" else 0o755)
        for mount in self._host_mounts:  # like Docker's bind create_host_path
            if mount.get("type") != "bind":
                continue
            src = Path(mount["source"])
            if mount.get("bind", {}).get("create_host_path") is not False:
                src.mkdir(parents=True, exist_ok=True)
            if not mount.get("read_only") and src.is_dir():
                for root, subdirs, files in os.walk(src):
                    for name in (root, *(os.path.join(root, n) for n in (*subdirs, *files))):
                        os.lchown(name, base, base)
        if self._network == "none":
            (self._sandbox_root / "resolv.conf").write_text(
                "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"
            )

    def _limits_for_task(self) -> SandboxLimits:
        cpus = self.task_env_config.cpus or self._default_cpus
        memory_mb = self.task_env_config.memory_mb or self._default_memory_mb
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.session_id)[:80] + f"-{self._uid_base // _UID_RANGE}"
        return SandboxLimits.create(name, cpus=cpus, memory_mb=memory_mb, max_processes=self._max_processes)

    def _plan_environment(self) -> list[tuple[Path, str, bool]]:
        """The Dockerfile's local copies; fails (SandboxTaskError) on RUN steps nothing stands in for."""
        copies, runs, self._image_env = dockerfile_plan(self.environment_dir, {"PATH": self._path})
        has_setup = bool(self._setup_script) and (self.environment_dir / str(self._setup_script)).is_file()
        if runs and not has_setup and self._dockerfile_run == "fail":
            steps = "; ".join(r[:120] for r in runs[:3])
            where = (
                "tests/Dockerfile (the separate verifier's image)"
                if self._is_verifier_image()
                else "Dockerfile"
            )
            raise SandboxTaskError(
                f"the task's {where} has RUN steps the local sandbox does not execute ({steps}) and no "
                f"{self.environment_dir.name}/{self._setup_script or 'local_setup.sh'} stands in for them: its "
                "environment would not be prepared (e.g. a test runner missing, scoring a correct solution 0). "
                "Add that script, or set environment_kwargs.dockerfile_run='ignore' to run without them."
            )
        return copies

    async def start(self, force_build: bool) -> None:
        self.preflight(network=self._network)
        self._binds = local_binds(self.environment_dir)
        # A bind of the same path stands in for the Dockerfile's COPY (e.g. a read-only base copy).
        copies = [c for c in self._plan_environment() if c[1].rstrip("/") not in self._binds]
        dirs = self._sandbox_dirs()
        await asyncio.to_thread(self._prepare_host_dirs, dirs)
        self._limits = await asyncio.to_thread(self._limits_for_task)
        # Nothing outlives this process: the holder dies with it (its parent-death signal), and the
        # sandbox's init with the holder (`--kill-child`), which ends the whole PID namespace.
        argv = ["setpriv", "--pdeathsig", "KILL", "unshare", "--kill-child=KILL"]
        argv += ["--mount", "--pid", "--fork", "--ipc", "--uts", "--propagation", "private"]
        if self._network == "none":
            argv.append("--net")
        argv = [*self._limits.join_argv(), *argv, "--", "/bin/sh", "-c", self._setup_script_text(dirs)]
        log_path = self._sandbox_root / "holder.log"
        with open(log_path, "wb") as log:  # noqa: ASYNC230 - a local file, opened once
            self._holder = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        assert self._holder.stdout is not None
        try:
            line = await asyncio.wait_for(self._holder.stdout.readline(), self._ready_timeout_sec)
        except TimeoutError:
            line = b""
        if line.decode(errors="replace").strip() != _READY:
            detail = log_path.read_text(errors="replace")[-2000:]
            raise SandboxStartError(f"sandbox namespace setup failed: {detail.strip() or 'no output'}")
        self._init_pid = await self._find_init_pid(self._holder.pid)
        # Held until stop: signals go through it, never to a PID a later process may have taken.
        self._init_pidfd = os.pidfd_open(self._init_pid)
        await self._map_users(self._init_pid)
        if self._network == "none":
            self._net = SandboxNetwork()
            try:
                await self._net.start(
                    f"/proc/{self._init_pid}/ns/net",
                    log_path=self.trial_paths.trial_dir / NETWORK_LOG_NAME,
                    session_id=self.session_id,
                    routes=self._routes,
                )
            except OSError as e:
                raise SandboxStartError(f"sandbox network setup failed: {e}") from e
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        if self._is_verifier_image():  # stands in for the verifier image's COPY of tests/
            await self.upload_dir(self.environment_dir, "/tests")
        for source, target, is_dir in copies:  # the Dockerfile's COPY/ADD of local files
            if is_dir:
                await self.upload_dir(source, target)
            else:
                await self.upload_file(source, target)
        await self._upload_environment_dir_after_start()
        await self._run_setup_script()

    async def _map_users(self, pid: int) -> None:
        """Map the init's new user namespace: inner 0..65535 → this trial's unprivileged host range."""
        own = os.readlink("/proc/self/ns/user")
        for _ in range(500):
            if os.readlink(f"/proc/{pid}/ns/user") != own:
                break
            await asyncio.sleep(0.01)
        else:
            raise SandboxStartError("the sandbox init did not enter its user namespace")
        mapping = f"0 {self._uid_base} {_UID_RANGE}\n"
        try:
            Path(f"/proc/{pid}/uid_map").write_text(mapping)
            Path(f"/proc/{pid}/gid_map").write_text(mapping)
        except OSError as e:
            raise SandboxStartError(f"cannot map the sandbox's users: {e}") from e

    async def _find_init_pid(self, holder_pid: int) -> int:
        """The PID (host view) of the holder's child, which is PID 1 of the sandbox's PID namespace."""
        # Within the namespace setup's own budget: a loaded host can take seconds to show the child.
        for _ in range(max(200, int(self._ready_timeout_sec / 0.01))):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    stat = Path(entry.path, "stat").read_text()
                except OSError:
                    continue
                # Fields after the parenthesised command name: state, ppid, ...
                if int(stat.rsplit(")", 1)[1].split()[1]) == holder_pid:
                    return int(entry.name)
            await asyncio.sleep(0.01)
        raise SandboxStartError("sandbox init process not found")

    async def _run_setup_script(self) -> None:
        if not self._setup_script:
            return
        script = self.environment_dir / self._setup_script
        if not script.is_file():
            return
        target = f"/tmp/.arl-{script.name}"
        await self.upload_file(script, target)
        result = await self.exec(f"bash {shlex.quote(target)}", cwd=self._workdir, user="root")
        if result.return_code != 0:
            tail = ((result.stderr or "") + (result.stdout or ""))[-2000:]
            raise SandboxStartError(f"{self._setup_script} exited with {result.return_code}: {tail}")

    async def stop(self, delete: bool) -> None:
        if self._init_pid is not None and self._init_pidfd is not None:
            with pinned_namespaces(self._init_pid, self._init_pidfd) as namespaces:
                if namespaces and not self._is_separate_verifier():
                    left = leftover_commands(_processes_in(namespaces), self._init_pid)
                    await asyncio.to_thread(write_agent_end, self.trial_paths.trial_dir, left)
                with contextlib.suppress(ProcessLookupError):
                    # the PID namespace dies with its init
                    signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
                os.close(self._init_pidfd)
                self._init_pid = self._init_pidfd = None
                if namespaces:
                    await self._check_ended(namespaces)
        if self._holder is not None:
            if self._holder.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._holder.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._holder.wait(), 10)
            self._holder = None
        if self._net is not None:
            await self._net.close()
            self._net = None
        if self._limits is not None:
            await asyncio.to_thread(self._limits.destroy)
            self._limits = None
        if delete:
            await asyncio.to_thread(shutil.rmtree, self._sandbox_root, True)

    def _is_separate_verifier(self) -> bool:
        return "__verifier__" in self.session_id

    async def _check_ended(self, namespaces: tuple[str, ...]) -> None:
        """Every process of the sandbox has ended (waits up to 5 s; SandboxError naming survivors if not)."""
        survivors: list[tuple[int, int, str]] = []
        for _ in range(100):
            survivors = _processes_in(namespaces)
            if not survivors:
                return
            for pid, _ppid, _command in survivors:
                _kill_if_in(pid, namespaces)
            await asyncio.sleep(0.05)
        names = ", ".join(f"{pid} {command}" for pid, _ppid, command in survivors[:5])
        raise SandboxError(f"processes of the sandbox survived its stop: {names}")

    # -- exec ------------------------------------------------------------------------------------

    def _exec_argv(
        self, command: str, cwd: str | None, env: dict[str, str] | None, user: str | int | None
    ) -> list[str]:
        if self._init_pid is None:
            raise SandboxError("the sandbox is not running (start() first)")
        # User namespace last (nsenter enters the others first while it still holds host privileges);
        # it then runs as the sandbox's root, an unprivileged uid on the host.
        argv = [*(self._limits.join_argv() if self._limits else [])]
        argv += ["nsenter", "--target", str(self._init_pid), "--user", "--mount", "--pid", "--ipc", "--uts"]
        if self._network == "none":
            argv.append("--net")
        argv.append("--")
        if self._limits is not None:
            argv += self._limits.rlimit_argv()
        home = "/root"
        if user is not None and str(user) not in ("root", "0"):
            try:
                entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(str(user))
            except KeyError as e:
                raise SandboxError(f"unknown user {user!r} (the sandbox reads the host's /etc/passwd)") from e
            home = entry.pw_dir
            argv += ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--"]
        full_env = {"PATH": self._path, "HOME": home, "LANG": "C.UTF-8", **self._image_env, **(env or {})}
        argv += ["env", "-i", *(f"{k}={v}" for k, v in full_env.items())]
        script = f"cd {shlex.quote(cwd or self._workdir)} || exit 1\n{command}"
        return [*argv, "bash", "-c", script]

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        try:
            argv = self._exec_argv(command, cwd, self._merge_env(env), self._resolve_user(user))
        except SandboxError as e:
            if self._init_pid is None:
                raise
            return ExecResult(stdout="", stderr=str(e), return_code=126)
        return await self._run(argv, timeout_sec=timeout_sec)

    async def _run(
        self,
        argv: list[str],
        *,
        timeout_sec: float | None,
        stdin: IO[bytes] | None = None,
        stdout_file: IO[bytes] | None = None,
    ) -> ExecResult:
        """Runs argv, streaming output to Harbor's output callback; kills its process group on timeout."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=stdout_file if stdout_file is not None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        callback = self._output_callback()
        chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

        async def pump(stream: asyncio.StreamReader | None, name: str) -> None:
            if stream is None:
                return
            while chunk := await stream.read(65536):
                chunks[name].append(chunk)
                if callback is not None:
                    await callback(chunk.decode(errors="replace"), name)  # type: ignore[arg-type]

        timed_out = False
        async with asyncio.TaskGroup() as tg:
            readers = [
                tg.create_task(pump(proc.stdout, "stdout")),
                tg.create_task(pump(proc.stderr, "stderr")),
            ]
            try:
                await asyncio.wait_for(proc.wait(), timeout_sec if timeout_sec else None)
            except (TimeoutError, asyncio.CancelledError) as e:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                for reader in readers:
                    reader.cancel()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 10)
                if isinstance(e, asyncio.CancelledError):
                    raise
            else:
                _, pending = await asyncio.wait(readers, timeout=_PIPE_DRAIN_SEC)
                for reader in pending:  # a background child still holds the pipe open
                    reader.cancel()
        if timed_out:
            raise SandboxExecTimeoutError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(
            stdout=b"".join(chunks["stdout"]).decode(errors="replace"),
            stderr=b"".join(chunks["stderr"]).decode(errors="replace"),
            return_code=proc.returncode if proc.returncode is not None else -1,
        )

    # -- file transfer (through the namespace, so every sandbox path works) -------------------------

    async def _checked(self, argv: list[str], what: str, **kwargs: Any) -> None:
        result = await self._run(argv, timeout_sec=600, **kwargs)
        if result.return_code != 0:
            raise SandboxError(
                f"{what} failed ({result.return_code}): {(result.stderr or '').strip()[-2000:]}"
            )

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        parent = shlex.quote(str(PurePosixPath(target_path).parent))
        cmd = f"mkdir -p {parent} && cat > {shlex.quote(target_path)}"
        with open(source_path, "rb") as f:  # noqa: ASYNC230 - the fd is handed to the child
            await self._checked(self._exec_argv(cmd, "/", None, "root"), f"upload to {target_path}", stdin=f)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tar:
                for child in sorted(Path(source_dir).iterdir()):
                    tar.add(child, arcname=child.name)
            tmp.seek(0)
            cmd = f"mkdir -p {shlex.quote(target_dir)} && tar -xf - -C {shlex.quote(target_dir)}"
            await self._checked(self._exec_argv(cmd, "/", None, "root"), f"upload to {target_dir}", stdin=tmp)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:  # noqa: ASYNC230 - the fd is handed to the child
            argv = self._exec_argv(f"cat -- {shlex.quote(source_path)}", "/", None, "root")
            await self._checked(argv, f"download of {source_path}", stdout_file=f)

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        if self.is_main_service(service):
            path = shlex.quote(source_dir)
            probe = await self._run(
                self._exec_argv(f"[ -d {path} ] && [ ! -L {path} ]", "/", None, "root"), timeout_sec=60
            )
            if probe.return_code != 0:
                # Removed or replaced by the agent: nothing of it is carried (an empty change), not a failure.
                Path(target_dir).mkdir(parents=True, exist_ok=True)
                return
            # The agent's tree, measured first as tar reads it (sparse files at their full length): one over the
            # carry's limit is refused as the agent's change; an entry the data filter refuses is left behind.
            # Neither is a failed carry.
            limit = carry_limit_bytes()
            size = await self._run(
                self._exec_argv(f"du -s --apparent-size -B1 {path}", "/", None, "root"), timeout_sec=120
            )
            fields = (size.stdout or "").split()
            if size.return_code != 0 or not fields or not fields[0].isdigit():
                raise SandboxError(
                    f"cannot measure {source_dir} before carrying it: {size.stderr or size.stdout}"
                )
            if int(fields[0]) > limit:
                refuse_carry(target_dir, source_dir, limit)
                return
            await self._download_dir(source_dir, target_dir, carry_filter)
            return
        await super().service_download_dir(source_dir, target_dir, service=service)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._download_dir(source_dir, target_dir, transfer_tar_filter)

    async def _download_dir(self, source_dir: str, target_dir: Path | str, tar_filter: Any) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as tmp:
            argv = self._exec_argv(f"tar -cf - -C {shlex.quote(source_dir)} .", "/", None, "root")
            await self._checked(argv, f"download of {source_dir}", stdout_file=tmp)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp, mode="r") as tar:
                tar.extractall(path=target, filter=tar_filter)
