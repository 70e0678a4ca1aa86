"""The project's Docker engine for the container tests: the one that answers, else installed and started.

What .ci/run does before the tests, for `uv run scripts/test.py` on any machine: scripts/docker/install.sh
(Debian's docker.io and Compose v2; skips what is installed), scripts/docker/start.sh (the project's own
dockerd on /run/arl-docker; leaves one that already answers alone) and scripts/docker/build_base_image.sh
(the SWE tasks' base image; skips when it exists). A step that fails (no root, no apt mirror, no PyPI)
ends the attempt with its reason and never the test run: the container tests then skip, saying why.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

DOCKER_SCRIPTS = Path(__file__).resolve().parent / "docker"
# install.sh may apt-get install and download Compose; the base image is a debootstrap (~5 min here).
STEP_TIMEOUT_S = {"install.sh": 1200, "start.sh": 180, "build_base_image.sh": 1800}


@dataclass(frozen=True)
class DockerEngine:
    """Where the tests find a Docker engine, and what the summary says about it."""

    host: str | None  # DOCKER_HOST for the tests; None: no engine, the container tests skip
    started: bool  # this run started the daemons, so it stops them at its end
    note: str  # one line for the summary


def answers(host: str, env: dict[str, str]) -> bool:
    """Whether a docker daemon answers on `host` (a DOCKER_HOST value) within 10 s."""
    try:
        return (
            subprocess.run(
                ["docker", "info"],
                env=env | {"DOCKER_HOST": host},
                capture_output=True,
                timeout=10,
                check=False,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _step(script: str, env: dict[str, str]) -> tuple[bool, str, str]:
    """Run one of scripts/docker/: (succeeded, its stdout, the last line it wrote to stderr). Its stderr
    is printed, indented, as it is progress for the log."""
    try:
        done = subprocess.run(
            ["bash", str(DOCKER_SCRIPTS / script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S[script],
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, "", f"{script} did not end within {STEP_TIMEOUT_S[script]} s"
    except OSError as exc:
        return False, "", f"{script} could not run: {exc}"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    for line in lines:
        print(f"  {line}", flush=True)
    last = lines[-1] if lines else f"{script} exited with {done.returncode}"
    return done.returncode == 0, done.stdout, last


def _exports(stdout: str) -> dict[str, str]:
    """The variables of start.sh's `export DOCKER_HOST=... ARL_DOCKER_STARTED=...` line."""
    for line in stdout.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            return dict(word.split("=", 1) for word in words[1:] if "=" in word)
    return {}


def prepare(env: dict[str, str]) -> DockerEngine:
    """The engine the container tests use: DOCKER_HOST's when it answers, else the project's own,
    installed, started and given its base image here where that works."""
    host = env.get("DOCKER_HOST")
    if host and answers(host, env):
        return DockerEngine(host, False, f"dockerd answers on {host}")
    print("docker: making the project's engine ready (scripts/docker/)", flush=True)
    ok, _, last = _step("install.sh", env)
    if not ok:
        return DockerEngine(None, False, f"no engine: scripts/docker/install.sh failed: {last}")
    ok, out, last = _step("start.sh", env)
    exported = _exports(out)
    if not ok or "DOCKER_HOST" not in exported:
        return DockerEngine(None, False, f"no engine: scripts/docker/start.sh failed: {last}")
    host, started = exported["DOCKER_HOST"], exported.get("ARL_DOCKER_STARTED") == "1"
    stopped = " (started by this run, stopped once the parts that need it end)"
    note = f"dockerd answers on {host}" + (stopped if started else "")
    ok, _, last = _step("build_base_image.sh", env | {"DOCKER_HOST": host})
    if not ok:
        note += f"; no SWE base image, its tests skip: {last}"
    return DockerEngine(host, started, note)


def stop(engine: DockerEngine, env: dict[str, str]) -> None:
    """Stop the daemons if this run started them (scripts/docker/stop.sh, by their PID files)."""
    if engine.started:
        subprocess.run(["bash", str(DOCKER_SCRIPTS / "stop.sh")], env=env, check=False, timeout=120)
