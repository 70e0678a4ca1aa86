"""One SWE-style task (its own pytest tests as the verifier) through HarborAgentLoop in both environments.

Harbor's docker environment (arl's `DockerEnvironment`: one image per task, no-network as compose's
`network_mode: none`) and the local unshare sandbox run the same task dir: oracle → 1.0, nop → 0.0,
an agent that breaks the package's import → a legitimate 0.0. In docker the image is built once and
reused, no container is left, and the container has only loopback. The docker cases need a running
dockerd and the base image (`.ci/run` starts and builds them with scripts/docker/); they skip, saying so,
when either is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from arl.harbor import FailurePolicy, HarborAgentLoop, HarborConfig
from arl.harbor.docker_environment import DOCKER_IMPORT_PATH, task_image_name
from arl.harbor.testing import SCRIPTED_AGENT_IMPORT_PATH
from arl.proxy.types import SamplingParams
from arl.rollout.types import Task

from .conftest import needs_sandbox
from .pytest_swe_task import DEBIAN_PYTHON, SWE_BASE_IMAGE, make_pytest_venv, write_pytest_swe_task

REPO = Path(__file__).resolve().parents[3]
WHEELHOUSE = REPO / ".cache" / "arl-harbor-tests" / "wheels-py311"


def _docker_problem() -> str | None:
    """Why the docker cases cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI (scripts/docker/install.sh installs it)"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "docker info timed out"
    if info.returncode != 0:
        host = os.environ.get("DOCKER_HOST", "the default socket")
        return f'dockerd does not answer on {host}: start it with eval "$(scripts/docker/start.sh)"'
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20).returncode != 0:
        return "no docker compose v2 plugin (scripts/docker/install.sh installs it)"
    if subprocess.run(
        ["docker", "image", "inspect", SWE_BASE_IMAGE], capture_output=True, timeout=20
    ).returncode:
        return f"no {SWE_BASE_IMAGE} image: build it with scripts/docker/build_base_image.sh"
    return None


@pytest.fixture(scope="module")
def docker_ready():
    problem = _docker_problem()
    if problem is not None:
        print(f"\nSKIP docker trials: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="module")
def swe_task(tmp_path_factory):
    if not Path(DEBIAN_PYTHON).exists():
        pytest.skip(f"needs Debian's {DEBIAN_PYTHON} (the python of the SWE base image) for the local venv")
    root = tmp_path_factory.mktemp("swe")
    try:
        venv = make_pytest_venv(root / "venv", WHEELHOUSE)
    except Exception as e:  # noqa: BLE001 - no PyPI and no cached wheelhouse: say so
        pytest.skip(f"cannot prepare a pytest venv (PyPI unreachable and no wheels in {WHEELHOUSE}): {e}")
    return write_pytest_swe_task(root / "tasks", venv=venv)


def _containers_of(environment_dir: Path) -> list[str]:
    """The ids of every container compose made from `environment_dir`, running or not."""
    label = f"label=com.docker.compose.project.working_dir={environment_dir.resolve()}"
    ps = ["docker", "ps", "-aq", "--filter", label]
    return subprocess.run(ps, capture_output=True, text=True, timeout=30).stdout.split()


def _compose_networks_of(task: Path) -> set[str]:
    """The networks compose made for trials of `task` (their projects are named `<task>__<trial id>__...`)."""
    ls = ["docker", "network", "ls", "--format", "{{.Name}}", "--filter", "label=com.docker.compose.project"]
    names = subprocess.run(ls, capture_output=True, text=True, timeout=30).stdout.split()
    return {name for name in names if name.startswith(f"{task.name}__")}


def config(environment: str, trials: Path, **fields) -> HarborConfig:
    env = {"environment_import_path": DOCKER_IMPORT_PATH} if environment == "docker" else {}
    return HarborConfig(
        trials_dir=str(trials), trial_timeout_sec=300.0, policy=FailurePolicy(max_attempts=1), **env, **fields
    )


async def run(cfg: HarborConfig, task: Path):
    t = Task(id=task.name, messages=[], agent="harbor", metadata={"harbor_task_path": str(task)})
    return await HarborAgentLoop(cfg).run(t, None, SamplingParams(), "req-1")  # type: ignore[arg-type]


BREAK_IMPORT = "rm minicalc/__init__.py; ls /sys/class/net"


@pytest.mark.parametrize(
    "environment",
    [pytest.param("local", marks=needs_sandbox), pytest.param("docker", marks=pytest.mark.slow)],
)
async def test_swe_task_oracle_nop_and_broken_import(environment, swe_task, tmp_path, request):
    if environment == "docker":
        request.getfixturevalue("docker_ready")
    oracle = await run(config(environment, tmp_path / "trials", agent="oracle"), swe_task)
    assert not oracle.failed and oracle.reward == 1.0, oracle.error
    assert oracle.rewards["fail_to_pass"] == 1.0
    nop = await run(config(environment, tmp_path / "trials", agent="nop"), swe_task)
    assert not nop.failed and nop.reward == 0.0, nop.error
    # The agent broke the package: pytest runs and fails on the import: a real 0, not a verifier failure.
    broken_cfg = config(
        environment,
        tmp_path / "trials",
        agent_import_path=SCRIPTED_AGENT_IMPORT_PATH,
        agent_kwargs={"script": BREAK_IMPORT},
    )
    broken = await run(broken_cfg, swe_task)
    assert not broken.failed and broken.reward == 0.0 and broken.failure_kind == "", broken.error
    scripted = json.loads(next((tmp_path / "trials").glob("*/agent/scripted.json")).read_text())
    assert scripted["stdout"].split() == ["lo"]  # no network device but loopback, in both environments
    if environment == "docker":
        image = task_image_name(swe_task / "environment")
        ids = subprocess.run(
            ["docker", "images", "-q", image], capture_output=True, text=True, timeout=30
        ).stdout.split()
        assert len(ids) == 1  # built once, kept across the three trials
        assert _containers_of(swe_task / "environment") == []  # every trial's container is gone


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_the_app_check_says_how_to_start_docker(monkeypatch):
    from arl.harbor import HarborConfigError
    from arl.harbor.trial_loop import check_harbor_config

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/arl-test.sock")
    for fields in (
        {"environment_import_path": DOCKER_IMPORT_PATH},
        {"environment_import_path": None, "environment_type": "docker"},
    ):
        with pytest.raises(
            HarborConfigError, match=r"does not answer on unix:///nonexistent.*scripts/docker/start\.sh"
        ):
            check_harbor_config(HarborConfig(**fields))


@pytest.mark.slow
async def test_separate_verifier_mode_in_docker(docker_ready, tmp_path, monkeypatch):
    """Harbor's separate verifier mode: the verifier's image is built from tests/Dockerfile (once), the
    agent's artifact reaches it; oracle 1.0, nop 0.0. When compose's `down` fails (as it can time out on a
    loaded host; Harbor only logs a verifier's failed stop), no container or network of the trial outlives it."""
    from harbor.environments.docker.docker import DockerEnvironment as HarborDockerEnvironment

    from arl.harbor.testing import write_hello_task

    task = write_hello_task(tmp_path / "tasks", verifier_mode="separate", tests_image=True)
    for dockerfile in (task / "environment" / "Dockerfile", task / "tests" / "Dockerfile"):
        dockerfile.write_text(dockerfile.read_text().replace("debian:bookworm-slim", SWE_BASE_IMAGE))
    oracle = await run(config("docker", tmp_path / "trials", agent="oracle"), task)
    assert not oracle.failed and oracle.reward == 1.0, oracle.error
    nop = await run(config("docker", tmp_path / "trials", agent="nop"), task)
    assert not nop.failed and nop.reward == 0.0, nop.error
    assert (
        subprocess.run(
            ["docker", "image", "inspect", task_image_name(task / "tests")], capture_output=True
        ).returncode
        == 0
    )

    async def down_fails(self, delete: bool) -> None:
        raise RuntimeError("compose down timed out")

    monkeypatch.setattr(HarborDockerEnvironment, "stop", down_fails)
    networks = _compose_networks_of(task)
    await run(config("docker", tmp_path / "trials", agent="oracle"), task)
    assert _containers_of(task / "environment") + _containers_of(task / "tests") == []
    assert _compose_networks_of(task) == networks


@pytest.mark.slow
async def test_images_step_records_image_and_build_time(docker_ready, tmp_path):
    """`python -m arl.harbor.swe.images <set>`: every task's image built once, recorded in the manifest."""
    from arl.harbor.swe.images import build_set_images

    task = write_pytest_swe_task(tmp_path / "set", name="minicalc-images")
    manifest = tmp_path / "set" / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": task.name, "image": None, "image_build_s": None}) + "\n")
    (row,) = await build_set_images(tmp_path / "set", force=True)
    assert row["image"] == task_image_name(task / "environment") and row["image_build_s"] > 0
    assert json.loads(manifest.read_text()) == row
    (again,) = await build_set_images(tmp_path / "set")  # exists: kept, with its recorded build time
    assert again == row
