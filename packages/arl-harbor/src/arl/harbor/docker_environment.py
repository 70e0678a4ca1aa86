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
4. **Teardown does not wait 10 s.** The main service's PID 1 is `sh -c "sleep infinity"`, which ignores
   SIGTERM, so every `compose down` waited out Docker's 10 s stop timeout; here it gets SIGKILL at once
   (the container is discarded anyway).

Select it with `HarborConfig(environment_import_path=DOCKER_IMPORT_PATH)`; it needs a running dockerd
(`DOCKER_HOST`; `scripts/docker/start.sh`) and the `docker compose` v2 plugin (`scripts/docker/install.sh`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shlex
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import filelock
from arl.harbor.errors import HarborError

from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import environment_content_hash
from harbor.environments.docker import COMPOSE_NO_NETWORK_PATH
from harbor.environments.docker.docker import DockerEnvironment as _HarborDockerEnvironment
from harbor.environments.docker.docker import _sanitize_docker_image_name
from harbor.models.task.config import NetworkMode, NetworkPolicy

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


class DockerEnvironment(_HarborDockerEnvironment):
    """Harbor's `DockerEnvironment` that reuses one image per environment content and runs no-network
    tasks with `network_mode: none` (see the module docstring).

    Extra constructor kwargs (`EnvironmentConfig.kwargs`): `build_network` (`docker build --network`,
    default the daemon's), `build_timeout_sec` (default: the task's `[environment].build_timeout_sec`).
    """

    def __init__(
        self,
        *args: Any,
        build_network: str | None = None,
        build_timeout_sec: float | None = None,
        **kwargs: Any,
    ) -> None:
        self._build_network = build_network
        self._build_timeout_override = build_timeout_sec
        super().__init__(*args, **kwargs)

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

    async def start(self, force_build: bool) -> None:
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
