"""A Harbor environment that runs a trial's commands as local processes, for machines without Docker.

`LocalSandboxEnvironment` keeps one Linux namespace "holder" per trial: `unshare --mount --pid` (and
`--net` when the task asks for no network) with per-trial host directories bind-mounted onto the
sandbox paths Harbor uses (`/app` or the task's workdir, `/logs`, `/tests`, `/solution`, `/tmp`) and,
by default, every other mount of the host remounted read-only. Each `exec` enters those namespaces with
`nsenter` and runs `bash -c` there, so a tmux server started by one exec is still reachable by the
next, and stopping the environment kills every process of the trial (the PID namespace dies with its
init). Select it with `EnvironmentConfig(import_path="arl.harbor.environment:LocalSandboxEnvironment")`.

This is isolation against accidents, not a security boundary: the sandbox runs as root on the host's
own root filesystem (the "image" is whatever the host has installed; the task's Dockerfile is not
built), shares the host's network unless the task disables it, has no CPU/memory limits, and a root
process inside can remount the host read-write again. See the package README.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import shlex
import shutil
import signal
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from arl.harbor.errors import SandboxError, SandboxExecTimeoutError, SandboxStartError

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities

_READY = "__ARL_SANDBOX_READY__"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Sandbox paths that always get a fresh per-trial directory (the workdir is added per task).
_BASE_TARGETS = ("/logs", "/tests", "/solution")
# Mounts never remounted read-only: kernel filesystems and device nodes.
_KEEP_WRITABLE_PREFIXES = ("/proc", "/sys", "/dev")
# After a command exits, how long to wait for its output pipes to close (background children may
# keep them open; Docker also returns when the command itself exits).
_PIPE_DRAIN_SEC = 2.0


def _mountinfo_points() -> list[str]:
    """Mount points of this process's mount namespace, decoded from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


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


class LocalSandboxEnvironment(BaseEnvironment):
    """Runs a Harbor trial's sandbox as namespaced local processes (see the module docstring).

    Constructor kwargs (from `EnvironmentConfig.kwargs`), besides Harbor's own:
      read_only_host: remount every host mount except the sandbox's own dirs read-only (default True).
      setup_script: file in the task's environment/ dir run as root in the workdir at start, standing in
        for the Dockerfile's RUN steps (default "local_setup.sh"; skipped when absent). A non-zero exit
        fails the start (SandboxStartError).
      extra_writable_dirs: more absolute sandbox paths that get a fresh writable per-trial directory.
      sandbox_root: host directory for the per-trial directories (default <trial_dir>/sandbox).
      path: PATH inside the sandbox (default the usual Debian PATH, not the caller's virtualenv).
      ready_timeout_sec: how long the namespace setup may take (default 30).
      auto_mounting: bind the trial's log dirs straight onto /logs/* (default True: no log copying).
    """

    def __init__(
        self,
        *args: Any,
        read_only_host: bool = True,
        setup_script: str | None = "local_setup.sh",
        extra_writable_dirs: Sequence[str] = (),
        sandbox_root: str | None = None,
        path: str = _DEFAULT_PATH,
        ready_timeout_sec: float = 30.0,
        auto_mounting: bool = True,
        **kwargs: Any,
    ) -> None:
        self._read_only_host = bool(read_only_host)
        self._setup_script = setup_script
        self._extra_dirs = [str(PurePosixPath(d)) for d in extra_writable_dirs]
        self._path = path
        self._ready_timeout_sec = float(ready_timeout_sec)
        self._holder: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._isolate_net = False
        super().__init__(*args, auto_mounting=auto_mounting, **kwargs)
        self._sandbox_root = (
            Path(sandbox_root) if sandbox_root else self.trial_paths.trial_dir / "sandbox"
        ).absolute()
        self._workdir = str(
            PurePosixPath(self.task_env_config.workdir or _dockerfile_workdir(self.environment_dir) or "/app")
        )
        if not self._workdir.startswith("/") or self._workdir == "/":
            raise SandboxError(f"workdir must be an absolute path other than '/', got {self._workdir!r}")

    @staticmethod
    def type() -> str:
        return "arl-local-sandbox"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # mounted: log dirs are bind-mounted from the trial dir; disable_internet: `unshare --net`.
        return EnvironmentCapabilities(mounted=True, disable_internet=True)

    def _validate_definition(self) -> None:
        for tool in ("unshare", "nsenter", "bash"):
            if shutil.which(tool) is None:
                raise SandboxError(f"LocalSandboxEnvironment needs {tool!r} on PATH")
        for name in ("Dockerfile", "docker-compose.yaml"):
            if (self.environment_dir / name).exists():
                self.logger.debug(
                    f"LocalSandboxEnvironment does not build environment/{name}; commands run on the "
                    "host's filesystem (provide environment/local_setup.sh for setup steps)"
                )

    # -- lifecycle -------------------------------------------------------------------------------

    def _sandbox_dirs(self) -> dict[str, Path]:
        """Sandbox path -> fresh per-trial host directory bound onto it (/tmp last: see `start`)."""
        targets = [self._workdir, *_BASE_TARGETS, *self._extra_dirs]
        dirs: dict[str, Path] = {}
        for target in dict.fromkeys(targets):
            name = re.sub(r"[^A-Za-z0-9._-]", "_", target.strip("/")) or "root"
            dirs[target] = self._sandbox_root / name
        dirs["/tmp"] = self._sandbox_root / "tmp"
        return dirs

    def _setup_script_text(self, dirs: dict[str, Path]) -> str:
        q = shlex.quote
        lines = ["set -e"]
        # Sources are host paths, resolved at mount time: bind /tmp last so that sources under the
        # host's /tmp (e.g. pytest's tmp_path) are still reachable while the others are mounted.
        for target, source in dirs.items():
            if target != "/tmp":
                lines.append(f"mount --bind {q(str(source))} {q(target)}")
        for mount in self._host_mounts:
            if mount.get("type") != "bind":
                raise SandboxStartError(f"LocalSandboxEnvironment supports bind mounts only, got {mount}")
            src, tgt = str(mount["source"]), str(mount["target"])
            lines.append(f"mkdir -p {q(tgt)} && mount --bind {q(src)} {q(tgt)}")
            if mount.get("read_only"):
                lines.append(f"mount -o remount,bind,ro {q(tgt)}")
        lines.append(f"mount --bind {q(str(dirs['/tmp']))} /tmp")
        if self._isolate_net:
            lines.append("ip link set lo up 2>/dev/null || true")
        if self._read_only_host:
            ours = [*dirs, *(str(m["target"]) for m in self._host_mounts)]
            for point in _mountinfo_points():
                if any(_under(point, p) for p in (*_KEEP_WRITABLE_PREFIXES, *ours)):
                    continue
                lines.append(f"mount -o remount,bind,ro {q(point)} 2>/dev/null || true")
        lines.append(f"echo {_READY}")
        lines.append("exec sleep infinity")
        return "\n".join(lines)

    async def start(self, force_build: bool) -> None:
        if os.geteuid() != 0:
            raise SandboxStartError("LocalSandboxEnvironment must run as root (it uses mount namespaces)")
        dirs = self._sandbox_dirs()
        for target, source in dirs.items():
            source.mkdir(parents=True, exist_ok=True)
            source.chmod(0o1777 if target == "/tmp" else 0o777)
            try:
                os.makedirs(target, exist_ok=True)  # the mount point on the host's root filesystem
            except OSError as e:
                raise SandboxStartError(f"cannot create mount point {target} on the host: {e}") from e
        for mount in self._host_mounts:  # like Docker's bind create_host_path
            if mount.get("type") == "bind" and mount.get("bind", {}).get("create_host_path") is not False:
                Path(mount["source"]).mkdir(parents=True, exist_ok=True)
        self._isolate_net = self._network_disabled
        argv = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private"]
        if self._isolate_net:
            argv.append("--net")
        argv += ["--", "/bin/sh", "-c", self._setup_script_text(dirs)]
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
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()
        await self._run_setup_script()

    async def _find_init_pid(self, holder_pid: int) -> int:
        """The PID (host view) of the holder's child, which is PID 1 of the sandbox's PID namespace."""
        for _ in range(200):
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
        if self._init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGKILL)  # the PID namespace dies with its init
            self._init_pid = None
        if self._holder is not None:
            if self._holder.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._holder.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._holder.wait(), 10)
            self._holder = None
        if delete:
            await asyncio.to_thread(shutil.rmtree, self._sandbox_root, True)

    # -- exec ------------------------------------------------------------------------------------

    def _exec_argv(
        self, command: str, cwd: str | None, env: dict[str, str] | None, user: str | int | None
    ) -> list[str]:
        if self._init_pid is None:
            raise SandboxError("the sandbox is not running (start() first)")
        argv = ["nsenter", "--target", str(self._init_pid), "--mount", "--pid"]
        if self._isolate_net:
            argv.append("--net")
        argv.append("--")
        home = "/root"
        if user is not None and str(user) not in ("root", "0"):
            try:
                entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(str(user))
            except KeyError as e:
                raise SandboxError(f"unknown user {user!r} (the sandbox shares the host's users)") from e
            home = entry.pw_dir
            argv += ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--"]
        full_env = {"PATH": self._path, "HOME": home, "LANG": "C.UTF-8", **(env or {})}
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

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as tmp:
            argv = self._exec_argv(f"tar -cf - -C {shlex.quote(source_dir)} .", "/", None, "root")
            await self._checked(argv, f"download of {source_dir}", stdout_file=tmp)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp, mode="r") as tar:
                tar.extractall(path=target, filter=transfer_tar_filter)
