"""LocalSandboxEnvironment on its own: exec semantics, file transfer, isolation, teardown."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from arl.harbor import LocalSandboxEnvironment, SandboxExecTimeoutError, SandboxStartError

from .conftest import needs_sandbox

# A duration no other process on the host uses, so pgrep finds only the sandbox's own sleeper.
BACKGROUND_SLEEP = "300.4242"

pytestmark = needs_sandbox


def make_env(tmp_path: Path, task_dir: Path, **kwargs) -> LocalSandboxEnvironment:
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    return LocalSandboxEnvironment(
        environment_dir=task_dir / "environment",
        environment_name="hello",
        session_id="hello__test__env",
        trial_paths=paths,
        task_env_config=TaskEnvironmentConfig(workdir="/app"),
        **kwargs,
    )


async def test_exec_runs_in_workdir_with_env_and_isolation(tmp_path, hello_task):
    env = make_env(tmp_path, hello_task, persistent_env={"TASK_VAR": "t"})
    await env.start(force_build=False)
    try:
        r = await env.exec("pwd; echo $TASK_VAR $EXTRA; echo err >&2; exit 3", env={"EXTRA": "x"})
        assert (r.stdout, r.stderr, r.return_code) == ("/app\nt x\n", "err\n", 3)
        assert (await env.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
        # Its own PID namespace: the init, bash and ps only.
        ps = await env.exec("ls /proc | grep -c '^[0-9]'")
        assert int(ps.stdout) < 10
        # The sandbox's root is its own (a tmpfs): writing there never reaches the host; system dirs
        # are read-only; the sandbox dirs are per-trial and writable.
        assert (await env.exec("touch /arl-should-not-exist")).return_code == 0
        assert not os.path.exists("/arl-should-not-exist")
        assert (await env.exec("touch /usr/arl-x")).return_code != 0
        assert (await env.exec("hostname")).stdout == "arl-sandbox\n"
        assert (
            await env.exec("echo hi > /app/a && echo hi > /tmp/b && echo hi > /logs/agent/c")
        ).return_code == 0
        assert (tmp_path / "trial" / "sandbox" / "dirs" / "app" / "a").read_text() == "hi\n"
        assert (tmp_path / "trial" / "agent" / "c").read_text() == "hi\n"  # /logs/agent is the trial's dir
        assert not Path("/tmp/b").exists()
        # Processes started by one exec are visible to the next (a tmux server must survive).
        await env.exec(f"nohup sleep {BACKGROUND_SLEEP} >/dev/null 2>&1 &")
        # init + ours (poll: the background child may not have exec'd `sleep` yet)
        count = (
            "for i in $(seq 100); do [ $(pgrep -x sleep | wc -l) = 2 ] && break; sleep 0.05; done; "
            "pgrep -x sleep | wc -l"
        )
        assert (await env.exec(count)).stdout.strip() == "2"
        # Unknown users fail like `docker exec -u` does.
        assert (await env.exec("id", user="no-such-user")).return_code == 126
        with pytest.raises(SandboxExecTimeoutError):
            await env.exec("sleep 30", timeout_sec=1)
    finally:
        await env.stop(delete=True)
    # Stopping killed the namespace, background processes included, and removed the sandbox dirs.
    out = await asyncio.create_subprocess_exec(
        "pgrep", "-f", f"^sleep {BACKGROUND_SLEEP}$", stdout=asyncio.subprocess.PIPE
    )
    assert (await out.communicate())[0] == b""
    assert not (tmp_path / "trial" / "sandbox").exists()


async def test_file_transfer_roundtrip(tmp_path, hello_task):
    env = make_env(tmp_path, hello_task)
    await env.start(force_build=False)
    try:
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "f.txt").write_text("one")
        (src / "sub" / "g.txt").write_text("two")
        await env.upload_dir(src, "/tests")
        await env.upload_file(src / "f.txt", "/app/deep/dir/f2.txt")
        assert (
            await env.exec("cat /tests/f.txt /tests/sub/g.txt /app/deep/dir/f2.txt")
        ).stdout == "onetwoone"
        await env.download_dir("/tests", tmp_path / "back")
        assert (tmp_path / "back" / "sub" / "g.txt").read_text() == "two"
        await env.download_file("/app/deep/dir/f2.txt", tmp_path / "f3.txt")
        assert (tmp_path / "f3.txt").read_text() == "one"
    finally:
        await env.stop(delete=True)


async def test_no_network_policy_isolates_the_network(tmp_path, hello_task):
    env = make_env(tmp_path, hello_task, network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    await env.start(force_build=False)
    try:
        links = await env.exec("ip -o link | cut -d: -f2")
        assert links.stdout.split() == ["lo"]
        probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'"
        assert (await env.exec(probe)).return_code != 0  # the host's loopback is not reachable
    finally:
        await env.stop(delete=True)
        server.close()


async def test_failing_setup_script_fails_start(tmp_path):
    from arl.harbor.testing import write_hello_task

    task = write_hello_task(tmp_path / "tasks", local_setup="echo broken >&2; exit 1")
    env = make_env(tmp_path, task)
    try:
        with pytest.raises(SandboxStartError, match="broken"):
            await env.start(force_build=False)
    finally:
        await env.stop(delete=True)


async def test_the_dockerfile_copies_env_and_local_binds_are_honoured(tmp_path, hello_task):
    """Without a build: COPY of local files lands where the image would have it, ENV is set in every
    exec, local_binds.json binds a prepared host dir read-only; a bind inside a system dir is refused."""
    import json

    from arl.harbor import SandboxError

    env_dir = hello_task / "environment"
    (env_dir / "data").mkdir()
    (env_dir / "data" / "x.txt").write_text("x\n")
    (env_dir / "one.txt").write_text("1\n")
    (env_dir / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nCOPY data /srv/data\nWORKDIR /app\nCOPY one.txt ./\n"
        "ENV TOOL_HOME=/arl/tool PATH=/arl/tool/bin:$PATH\n"
    )
    prepared = tmp_path / "prepared"
    (prepared / "bin").mkdir(parents=True)
    (prepared / "bin" / "hello-tool").write_text("#!/bin/sh\necho tool ok\n")
    (prepared / "bin" / "hello-tool").chmod(0o755)
    (env_dir / "local_binds.json").write_text(json.dumps({"/arl/tool": str(prepared)}))
    env = make_env(tmp_path, hello_task)
    await env.start(force_build=False)
    try:
        r = await env.exec("cat /srv/data/x.txt /app/one.txt; echo $TOOL_HOME; hello-tool; touch /arl/tool/w")
        assert r.stdout == "x\n1\n/arl/tool\ntool ok\n" and r.return_code != 0  # the bind is read-only
    finally:
        await env.stop(delete=True)
    (env_dir / "local_binds.json").write_text(json.dumps({"/usr/local/tool": str(prepared)}))
    with pytest.raises(SandboxError, match="under /usr"):
        await make_env(tmp_path / "again", hello_task).start(force_build=False)
