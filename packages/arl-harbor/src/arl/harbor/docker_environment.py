"""Harbor's docker environment with two changes that SWE training on a plain Docker engine needs.

1. **Each task image is built once and reused by every trial.** Harbor 0.25's compose build names the
   image after the trial's compose project (`<session>-main`), rebuilds it at every trial start and
   removes it at teardown (`down --rmi local`). Here the image is built once per environment content
   (`docker build -t hb__<environment_id>`, Harbor's own content-addressed name; locked per image across
   tasks and processes) and every trial starts from it as a prebuilt image (compose's `image:`), which
   teardown keeps. `build_task_image` is the same build for a prebuild step (`arl.harbor.swe.images`).
   A task's own `[environment].docker_image` and `force_build=True` behave as in Harbor.
2. **`network_mode = "no-network"` works without Harbor's egress sidecar.** Harbor enforces no-network
   with a sidecar container whose image and kernel probe come from Docker Hub (unreachable here), and
   otherwise rejects the task. Here the main service gets compose's `network_mode: none` (Harbor's own
   `docker-compose-no-network.yaml`): loopback only. Allowlists still go through Harbor's sidecar.
3. **The separate verifier's image need not contain the task's workdir.** Harbor runs every exec
   with the task's workdir as cwd and ignores whether creating the log dirs worked; in a verifier image
   built from `tests/` without that dir, nothing was created and the verifier failed
   (`DownloadVerifierDirError`). Here the workdir is created first and a failure to create the dirs raises.
4. **The agent's end is checked.** When the agent's environment stops, what it left running (besides the
   container's init and terminus-2's terminal) is recorded (`arl.harbor.agent_end`), and the stop fails
   when the container still runs after it. A separate verifier's artifact directory the agent removed or
   replaced by a link is carried as an empty directory (an empty change, graded as such), not a failed
   collection.
5. **Teardown does not wait 10 s.** The main service's PID 1 is `sh -c "sleep infinity"`, which ignores
   SIGTERM, so every `compose down` waited out Docker's 10 s stop timeout; here it gets SIGKILL at once
   (the container is discarded anyway).
6. **Execs and file copies go to the Docker Engine API, not through `docker compose`.** Harbor runs each
   of a trial's ~10 execs and ~5 copies as a `docker compose` CLI call (two Go processes that parse the
   compose files and query the daemon each time; ~1.5 CPU s per trial, the largest CPU cost of a docker
   trial outside its own processes: BENCHMARKS.md). Here the main service's container is looked up once
   and exec / upload / download are requests on the daemon's unix socket (`arl.harbor.docker_engine`),
   with Harbor's semantics: `bash -c` as the task's user in its workdir with its env, stdout and stderr
   interleaved in `stdout`, the exit code, `RuntimeError("Command timed out ...")`, files owned by root
   in the container and by this user on the host. The `compose down` before `up` is skipped when the
   project has nothing to remove (its session id is new), and the daemon's OS is asked once per process.
   `compose up` / `down` stay. `engine_api=False` (or a `DOCKER_HOST` that is not a unix socket) keeps
   Harbor's compose path for all of it.

Select it with `HarborConfig(environment_import_path=DOCKER_IMPORT_PATH)`; it needs a running dockerd
(`DOCKER_HOST`; `scripts/docker/start.sh`) and the `docker compose` v2 plugin (`scripts/docker/install.sh`).
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import shlex
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import filelock
from harbor.environments.base import ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import environment_content_hash
from harbor.environments.docker import COMPOSE_NO_NETWORK_PATH
from harbor.environments.docker.docker import DockerEnvironment as _HarborDockerEnvironment
from harbor.environments.docker.docker import (
    _sanitize_docker_compose_project_name,
    _sanitize_docker_image_name,
)
from harbor.models.task.config import NetworkMode, NetworkPolicy

from arl.harbor.agent_end import leftover_commands, write_agent_end
from arl.harbor.carry import carry_filter, carry_limit_bytes, refuse_carry
from arl.harbor.docker_engine import ArchiveTooLargeError, DockerEngine, DockerEngineError, engine_socket_path
from arl.harbor.errors import HarborError

DOCKER_IMPORT_PATH = "arl.harbor.docker_environment:DockerEnvironment"
# Cross-process build locks (agent-loop worker processes share one daemon).
_LOCK_DIR = Path(os.environ.get("ARL_DOCKER_BUILD_LOCKS", "/tmp/arl-docker-build-locks"))


@functools.cache
def _fast_stop_compose_path() -> Path:
    """A compose override giving the main service SIGKILL as its stop signal (written once per process)."""
    path = Path(tempfile.mkdtemp(prefix="arl-docker-compose-")) / "docker-compose-fast-stop.json"
    path.write_text(json.dumps({"services": {"main": {"stop_signal": "SIGKILL"}}}))
    return path


class DockerBuildError(HarborError, RuntimeError):
    """`docker build` of a task's environment failed or timed out (a sandbox failure: retried by policy)."""


def task_image_name(environment_dir: Path) -> str:
    """The content-addressed tag of a task's environment image: `hb__<environment content hash>`."""
    return _sanitize_docker_image_name(f"hb__{environment_content_hash(environment_dir)}")


async def _run(argv: Sequence[str], timeout_sec: float | None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_sec)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace")


async def image_exists(image: str) -> bool:
    code, _ = await _run(["docker", "image", "inspect", "--format", "{{.Id}}", image], 30)
    return code == 0


START_HINT = 'scripts/docker/install.sh && eval "$(scripts/docker/start.sh)"'


def docker_preflight() -> None:
    """Raise HarborError, saying how to start it, unless the docker CLI, dockerd and compose v2 answer."""
    import shutil
    import subprocess

    if shutil.which("docker") is None:
        raise HarborError(f"no docker CLI on PATH; install and start the engine with: {START_HINT}")
    host = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20
        )
        compose = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise HarborError(
            f"docker does not answer on {host} within 20 s; (re)start it with: {START_HINT}"
        ) from None
    if info.returncode != 0:
        detail = (info.stderr or info.stdout).strip().splitlines()[-1:] or [""]
        raise HarborError(
            f"dockerd does not answer on {host} ({detail[0][:200]}); start it with: {START_HINT} "
            "(that exports DOCKER_HOST=unix:///run/arl-docker/docker.sock; export it for this run too)"
        )
    if compose.returncode != 0:
        raise HarborError(
            f"`docker compose` (v2) is missing; Harbor's docker environment needs it: {START_HINT}"
        )


_image_locks: dict[str, asyncio.Lock] = {}


async def build_task_image(
    environment_dir: Path,
    *,
    image: str | None = None,
    force: bool = False,
    network: str | None = None,
    no_cache: bool = False,
    timeout_sec: float = 1800.0,
) -> tuple[str, float | None]:
    """Builds the task's `environment/` into `image` (default `task_image_name`) unless it exists.

    Returns (image, seconds spent building; None when it already existed). Concurrent callers (tasks,
    processes) of one image wait for a single build. `network`: `docker build --network` (None: the
    daemon's default; "none" proves the build needs no network); `no_cache`: `docker build --no-cache` (the
    full cost of a build, e.g. to measure it).
    """
    environment_dir = Path(environment_dir)
    if not (environment_dir / "Dockerfile").is_file():
        raise DockerBuildError(f"{environment_dir}/Dockerfile does not exist")
    image = image or task_image_name(environment_dir)
    lock = _image_locks.setdefault(image, asyncio.Lock())
    async with lock:
        if not force and await image_exists(image):
            return image, None
        _LOCK_DIR.mkdir(parents=True, exist_ok=True)
        async with filelock.AsyncFileLock(
            str(_LOCK_DIR / f"{image.replace('/', '_').replace(':', '_')}.lock")
        ):
            if not force and await image_exists(image):
                return image, None
            argv = ["docker", "build", "--quiet", "--tag", image]
            if network:
                argv += ["--network", network]
            if no_cache:
                argv.append("--no-cache")
            argv.append(str(environment_dir.resolve()))
            started = time.monotonic()
            try:
                code, out = await _run(argv, timeout_sec)
            except TimeoutError:
                raise DockerBuildError(
                    f"docker build of {environment_dir} timed out after {timeout_sec:.0f}s"
                ) from None
            if code != 0:
                raise DockerBuildError(f"docker build of {environment_dir} failed ({code}): {out[-3000:]}")
            return image, time.monotonic() - started


_GO_MODE_DIR = 1 << 31  # os.ModeDir in the Engine API's path stat
_GO_MODE_SYMLINK = 1 << 27  # os.ModeSymlink


def _rebased_members(tar: tarfile.TarFile, top: str, new_top: str) -> list[tarfile.TarInfo]:
    """The members of an Engine API archive (top entry `top`) renamed from `top/...` to `new_top/...`."""
    out = []
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if not parts or parts[0] != top:
            raise HarborError(f"unexpected entry {member.name!r} in the archive of {top!r}")
        out.append(member.replace(name=str(PurePosixPath(new_top, *parts[1:])), deep=False))
    return out


def _extract(archive: BinaryIO, top: str, target: Path, tar_filter: Any = "data") -> None:
    """Extract an Engine API archive whose top entry is `top` as `target` (a file or a dir's contents),
    owned by this user (tarfile's "data" filter, or `tar_filter`: nothing outside `target`, no devices)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    archive.seek(0)
    with tarfile.open(fileobj=archive) as tar:
        members = _rebased_members(tar, top, target.name)
        tar.extractall(target.parent, members=members, filter=tar_filter)


_daemon_os_cache: list[str] = []


def _daemon_os() -> str | None:
    """The daemon's OSType, asked once per process (a failed query is asked again next time)."""
    if not _daemon_os_cache:
        found = _HarborDockerEnvironment._detect_daemon_os()
        if found is None:
            return None
        _daemon_os_cache.append(found)
    return _daemon_os_cache[0]


class DockerEnvironment(_HarborDockerEnvironment):
    """Harbor's `DockerEnvironment` that reuses one image per environment content, runs no-network
    tasks with `network_mode: none` and sends execs and copies to the Engine API (module docstring).

    Extra constructor kwargs (`EnvironmentConfig.kwargs`): `build_network` (`docker build --network`,
    default the daemon's), `build_timeout_sec` (default: the task's `[environment].build_timeout_sec`),
    `engine_api` (default True: execs and copies over the daemon's unix socket; False: Harbor's
    `docker compose exec` / `cp` calls).
    """

    def __init__(
        self,
        *args: Any,
        build_network: str | None = None,
        build_timeout_sec: float | None = None,
        engine_api: bool = True,
        **kwargs: Any,
    ) -> None:
        self._build_network = build_network
        self._build_timeout_override = build_timeout_sec
        socket_path = engine_socket_path() if engine_api else None
        self._engine = DockerEngine(socket_path) if socket_path else None
        self._container_id: str | None = None
        super().__init__(*args, **kwargs)
        if self._is_windows_container:
            self._engine = None

    @classmethod
    def preflight(cls, **kwargs: Any) -> None:  # type: ignore[override]
        """Raise HarborError, saying how to start it, when the Docker engine is not usable (app start)."""
        docker_preflight()

    @staticmethod
    def _requires_egress_control(
        *, startup_network_policy: NetworkPolicy, phase_network_policies: Sequence[NetworkPolicy]
    ) -> bool:
        # Only allowlists need Harbor's sidecar; no-network is compose's network_mode none.
        policies = [startup_network_policy, *phase_network_policies]
        return any(p.network_mode == NetworkMode.ALLOWLIST for p in policies)

    @property
    def _no_network(self) -> bool:
        return self.network_policy.network_mode == NetworkMode.NO_NETWORK and not self._enable_egress_control

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        caps = super().capabilities
        return caps.model_copy(update={"disable_internet": True})

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths = super()._docker_compose_paths
        if self._no_network:
            paths.append(COMPOSE_NO_NETWORK_PATH)
        paths.append(_fast_stop_compose_path())
        return paths

    async def ensure_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> Any:
        workdir = self.task_env_config.workdir
        if workdir:  # every exec's default cwd: without it even the mkdir below cannot run
            made = await self.exec(f"mkdir -p {shlex.quote(workdir)}", cwd="/", user="root")
            if made.return_code != 0:
                raise HarborError(
                    f"cannot create the workdir {workdir} in the container: {made.stdout or ''}"
                )
        result = await super().ensure_dirs(dirs, chmod=chmod)
        if result is not None and result.return_code != 0:
            raise HarborError(f"cannot create {list(dirs)} in the container: {(result.stdout or '')[-500:]}")
        return result

    @classmethod
    def _detect_daemon_os(cls) -> str | None:
        # Harbor asks at every start, with a blocking `docker info`; the daemon's OS does not change.
        return _daemon_os()

    @property
    def _project(self) -> str:
        return _sanitize_docker_compose_project_name(self.session_id)

    async def _main_container(self) -> str | None:
        """The main service's container id (looked up once after `up`), None before it exists."""
        if self._container_id is None and self._engine is not None:
            found = await self._engine.containers(
                [f"com.docker.compose.project={self._project}", "com.docker.compose.service=main"],
                all_states=False,
            )
            if found:
                self._container_id = found[0]["Id"]
        return self._container_id

    async def _run_docker_compose_command(self, command: list[str], *args: Any, **kwargs: Any) -> ExecResult:
        first_down = command == ["down", "--remove-orphans"] and self._container_id is None
        if first_down and self._engine is not None:
            # Harbor clears leftovers of an earlier run of this session before `up`; a new session has none.
            labels = [f"com.docker.compose.project={self._project}"]
            if not await self._engine.containers(labels) and not await self._engine.networks(labels):
                return ExecResult(return_code=0)
        return await super()._run_docker_compose_command(command, *args, **kwargs)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        container = await self._main_container()
        if container is None:
            return await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        assert self._engine is not None
        resolved_user = self._resolve_user(user)
        callback = self._output_callback()
        sink = None if callback is None else (lambda line: callback(line, "stdout"))
        try:
            code, output = await self._engine.exec(
                container,
                self._platform.exec_shell_args(command),
                user=None if resolved_user is None else str(resolved_user),
                workdir=cwd or self.task_env_config.workdir,
                env=self._merge_env(env),
                timeout_sec=timeout_sec,
                on_output=sink,
            )
        except TimeoutError:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        # As Harbor's `compose exec` with stderr folded into stdout: one stream, None when empty.
        return ExecResult(stdout=output.decode(errors="replace") or None, stderr=None, return_code=code)

    async def _put_archive(self, container: str, directory: str, tar_bytes: bytes) -> None:
        assert self._engine is not None
        try:
            await self._engine.put_archive(container, directory, tar_bytes)
        except DockerEngineError as e:
            if e.status != 404:
                raise
            # As Harbor's fallback when `compose cp` finds no target dir: create it, then extract.
            made = await self.exec(f"mkdir -p {shlex.quote(directory)}", cwd="/", user="root")
            if made.return_code != 0:
                raise HarborError(f"cannot create {directory} in the container: {made.stdout or ''}") from e
            await self._engine.put_archive(container, directory, tar_bytes)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        container = await self._main_container()
        if container is None:
            return await super().upload_file(source_path, target_path)
        assert self._engine is not None
        # `docker cp FILE main:TARGET` semantics: into TARGET when it is a dir, else as TARGET.
        into_dir = target_path.endswith("/")
        if not into_dir:
            stat = await self._engine.path_stat(container, target_path)
            into_dir = stat is not None and bool(stat.get("mode", 0) & _GO_MODE_DIR)
        directory, name = self._platform._container_file_target(
            source_path, target_path, target_is_dir=into_dir
        )
        tar_bytes = await asyncio.to_thread(self._platform._tar_file, source_path, name)
        await self._put_archive(container, directory, tar_bytes)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        container = await self._main_container()
        if container is None:
            return await super().upload_dir(source_dir, target_dir)
        # `docker cp DIR/. main:TARGET`: DIR's contents into TARGET (created when missing).
        tar_bytes = await asyncio.to_thread(self._platform._tar_dir_contents, source_dir)
        await self._put_archive(container, target_dir, tar_bytes)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        container = await self._main_container()
        if container is None:
            return await super().download_file(source_path, target_path)
        assert self._engine is not None
        target = Path(target_path).absolute()
        if target.is_dir():  # `docker cp main:FILE DIR` puts it inside DIR
            target = target / PurePosixPath(source_path).name
        tar_bytes = await self._engine.get_archive(container, source_path)
        await asyncio.to_thread(_extract, io.BytesIO(tar_bytes), PurePosixPath(source_path).name, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        container = await self._main_container()
        if container is None:
            return await super().download_dir(source_dir, target_dir)
        await self._download_dir(container, source_dir, target_dir, "data")

    async def _download_dir(
        self,
        container: str,
        source_dir: str,
        target_dir: Path | str,
        tar_filter: Any,
        max_bytes: int | None = None,
    ) -> None:
        assert self._engine is not None
        # `docker cp main:DIR/. TARGET`: DIR's contents into TARGET (created when missing). The archive goes
        # through a temporary file: a tree as large as the disk allows never sits in memory.
        source = PurePosixPath(source_dir.rstrip("/") or "/")
        with tempfile.TemporaryFile() as archive:
            await self._engine.get_archive_into(container, str(source), archive, max_bytes=max_bytes)
            target = Path(target_dir).absolute()
            target.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(_extract, archive, source.name or "/", target, tar_filter)

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        container = await self._main_container()
        if container is not None and self.is_main_service(service):
            assert self._engine is not None
            stat = await self._engine.path_stat(container, source_dir)
            mode = int((stat or {}).get("mode", 0))
            if stat is None or mode & _GO_MODE_SYMLINK or not mode & _GO_MODE_DIR:
                # Removed or replaced by the agent: nothing of it is carried (an empty change).
                Path(target_dir).mkdir(parents=True, exist_ok=True)
                return
            # The agent's tree: an entry the data filter refuses is left behind, and a tree over the carry's
            # limit is refused as the agent's change, not a failed carry.
            limit = carry_limit_bytes()
            try:
                await self._download_dir(container, source_dir, target_dir, carry_filter, max_bytes=limit)
            except ArchiveTooLargeError:
                refuse_carry(target_dir, source_dir, limit)
            return
        await super().service_download_dir(source_dir, target_dir, service=service)

    async def _record_agent_end(self, container: str) -> None:
        """What the agent left running in its container (not for a separate verifier's container)."""
        assert self._engine is not None
        if "__verifier__" in self.session_id:
            return
        try:
            info = await self._engine.inspect(container)
            if info is None or not info.get("State", {}).get("Running"):
                return
            processes = await self._engine.processes(container)
        except DockerEngineError as e:
            self.logger.debug(f"cannot list the container's processes before its stop: {e}")
            return
        left = leftover_commands(processes, int(info["State"].get("Pid") or 0))
        await asyncio.to_thread(write_agent_end, self.trial_paths.trial_dir, left)

    async def _check_ended(self, container: str) -> None:
        """The container runs no more after the stop (HarborError if it does)."""
        assert self._engine is not None
        info = await self._engine.inspect(container)
        if info is not None and info.get("State", {}).get("Running"):
            raise HarborError(f"the container {container[:12]} still runs after its stop")

    async def stop(self, delete: bool) -> None:
        container = self._container_id
        try:
            if container is not None and self._engine is not None:
                await self._record_agent_end(container)
            await super().stop(delete)
            if container is not None and self._engine is not None:
                await self._check_ended(container)
        finally:
            self._container_id = None
            if self._engine is not None:
                try:
                    if delete:
                        await self._remove_leftovers()
                finally:
                    await self._engine.close()

    async def _remove_leftovers(self) -> None:
        """Every container and network of this environment's compose project, removed. compose's `down` can
        fail or time out on a loaded host, and Harbor only logs a separate verifier's failed stop: without
        this its container would run on, unseen, after the trial, and each such trial would keep a network,
        until after ~30 the engine has no address pool left and no trial can start."""
        assert self._engine is not None
        project = [f"com.docker.compose.project={self._project}"]
        for found in await self._engine.containers(project):
            await self._engine.remove_container(found["Id"])
        for network in await self._engine.networks(project):
            await self._engine.remove_network(network["Id"])

    async def start(self, force_build: bool) -> None:
        self._container_id = None
        if not self.task_env_config.docker_image and not force_build and self._dockerfile_path.is_file():
            timeout = self._build_timeout_override or self.task_env_config.build_timeout_sec
            image, _ = await build_task_image(
                self.environment_dir,
                image=self._main_image_name,
                network=self._build_network,
                timeout_sec=timeout,
            )
            # From here on Harbor treats it as a prebuilt image (no compose build, kept at teardown).
            self.task_env_config = self.task_env_config.model_copy(update={"docker_image": image})
            self._env_vars.prebuilt_image_name = image
        await super().start(force_build)
