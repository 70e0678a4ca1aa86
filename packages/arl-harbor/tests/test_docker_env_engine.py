"""arl's DockerEnvironment with execs and copies over the Docker Engine API, against Harbor's own
`docker compose exec` / `cp` path (`engine_api=False`) on a real container: the same results for the
same calls (user, workdir, env, exit code, interleaved output, streamed lines, timeout, files in and
out), the API path spawning no docker CLI per exec, and no container or network left after stop.
Needs a running dockerd and the SWE base image (skips, saying so, otherwise).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from harbor.environments.docker.docker import _sanitize_docker_compose_project_name
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from arl.harbor.docker_environment import DockerEnvironment

from .pytest_swe_task import SWE_BASE_IMAGE
from .test_docker_env import docker_ready  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def session(name: str) -> str:
    return f"{name}__engine-test__{os.getpid()}"


def make_env(tmp_path: Path, name: str, engine_api: bool) -> DockerEnvironment:
    env_dir = tmp_path / name / "environment"
    env_dir.mkdir(parents=True)
    (env_dir / "Dockerfile").write_text(f"FROM {SWE_BASE_IMAGE}\nRUN useradd -m agent\nWORKDIR /app\n")
    paths = TrialPaths(tmp_path / name / "trial")
    paths.mkdir()
    return DockerEnvironment(
        environment_dir=env_dir,
        environment_name=name,
        session_id=session(name),
        trial_paths=paths,
        task_env_config=TaskEnvironmentConfig(workdir="/app"),
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
        persistent_env={"TASK_VAR": "t v"},
        engine_api=engine_api,
    )


async def exercise(env: DockerEnvironment, host: Path) -> dict:
    """The same calls on either path; returns what they gave."""
    out: dict = {}
    r = await env.exec("pwd; echo $TASK_VAR $EXTRA; echo err >&2; id -un; exit 3", env={"EXTRA": "x"})
    # stdout then stderr in one stream; the daemon copies the two pipes concurrently, so only the order
    # within each is defined.
    merged = (r.stdout or "").splitlines(keepends=True)
    out["exec"] = ([x for x in merged if x != "err\n"], merged.count("err\n"), r.stderr, r.return_code)
    r = await env.exec("pwd; id -un; touch made-by-agent", cwd="/tmp", user="agent")
    out["user_cwd"] = (r.stdout, r.return_code)
    out["empty"] = (await env.exec("true")).model_dump()
    lines: list[tuple[str, str]] = []

    async def collect(text: str, stream: str) -> None:
        lines.append((text, stream))

    with env.scoped_output_callback(collect):
        r = await env.exec("echo one; echo two; printf three")
    out["streamed"] = (lines, r.stdout)
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        await env.exec("sleep 5", timeout_sec=1)

    (host / "up").mkdir(parents=True)
    (host / "up" / "a.txt").write_text("A")
    (host / "up" / "sub").mkdir()
    (host / "up" / "sub" / "b.sh").write_text("#!/bin/sh\necho b\n")
    (host / "up" / "sub" / "b.sh").chmod(0o755)
    await env.upload_dir(host / "up", "/new/dir")  # created when missing
    await env.upload_file(host / "up" / "a.txt", "/app")  # into an existing dir
    await env.upload_file(host / "up" / "a.txt", "/app/renamed.txt")  # as a new file
    await env.upload_file(host / "up" / "a.txt", "/missing/parent/c.txt")  # parent created
    r = await env.exec(
        "cd / && find new app missing -printf '%p %u %m\\n' | sort && /new/dir/sub/b.sh && cat app/a.txt"
    )
    out["uploaded"] = r.stdout

    await env.exec("mkdir -p /logs/x/y && echo L > /logs/x/y/l.txt && echo F > /tmp/f.txt", user="root")
    await env.download_file("/tmp/f.txt", host / "down" / "f.txt")
    (host / "down" / "into").mkdir()
    await env.download_file("/tmp/f.txt", host / "down" / "into")  # into an existing host dir
    await env.download_dir("/logs/x", host / "down" / "x")
    found = sorted(
        (str(p.relative_to(host / "down")), p.read_text() if p.is_file() else None, p.stat().st_uid)
        for p in (host / "down").rglob("*")
    )
    out["downloaded"] = found
    return out


async def run_env(tmp_path: Path, name: str, engine_api: bool, monkeypatch) -> tuple[dict, int]:
    """What `exercise` gave, and how many processes it spawned."""
    env = make_env(tmp_path, name, engine_api)
    await env.start(force_build=False)
    spawned = []
    real = asyncio.create_subprocess_exec

    async def counting(*argv, **kwargs):
        spawned.append(argv)
        return await real(*argv, **kwargs)

    try:
        with monkeypatch.context() as m:
            m.setattr(asyncio, "create_subprocess_exec", counting)
            return await exercise(env, tmp_path / name / "host"), len(spawned)
    finally:
        await env.stop(delete=True)


async def test_engine_api_matches_compose_and_leaves_nothing(
    docker_ready,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    api, api_spawned = await run_env(tmp_path, "api", True, monkeypatch)
    compose, compose_spawned = await run_env(tmp_path, "compose", False, monkeypatch)
    assert api == compose
    assert (api_spawned, compose_spawned > 10) == (0, True)  # no docker CLI at all on the API path
    assert api["exec"] == (["/app\n", "t v x\n", "root\n"], 1, None, 3)
    assert api["user_cwd"] == ("/tmp\nagent\n", 0)
    assert api["empty"] == {"stdout": None, "stderr": None, "return_code": 0}
    assert api["streamed"] == (
        [("one\n", "stdout"), ("two\n", "stdout"), ("three", "stdout")],
        "one\ntwo\nthree",
    )
    assert "new/dir/sub/b.sh root 755" in api["uploaded"] and "missing/parent/c.txt root" in api["uploaded"]
    assert api["uploaded"].endswith("b\nA")
    assert ("x/y/l.txt", "L\n", os.getuid()) in api["downloaded"]
    assert ("into/f.txt", "F\n", os.getuid()) in api["downloaded"]
    for name in ("api", "compose"):
        label = f"label=com.docker.compose.project={_sanitize_docker_compose_project_name(session(name))}"
        for kind in (["ps", "-aq"], ["network", "ls", "-q"], ["volume", "ls", "-q"]):
            left = subprocess.run(
                ["docker", *kind, "--filter", label], capture_output=True, text=True, timeout=30, check=True
            )
            assert left.stdout.split() == [], (kind, name)
