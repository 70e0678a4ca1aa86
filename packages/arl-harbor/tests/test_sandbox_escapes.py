"""The local sandbox as a boundary: every escape a scripted agent tries fails, and is seen to fail.

Each attempt runs as the agent would (a command in the sandbox, as its root). The end-to-end tests run
whole Harbor trials with a scripted agent (`arl.harbor.testing.ScriptedAgent`) through
`HarborAgentLoop`, in shared and separate verifier modes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from arl.harbor import HarborAgentLoop, LocalSandboxEnvironment
from arl.harbor.environment import pinned_namespaces
from arl.harbor.testing import HELLO_SOLUTION, SCRIPTED_AGENT_IMPORT_PATH, write_hello_task
from arl.rollout.types import Task

from .conftest import needs_sandbox

pytestmark = needs_sandbox


def make_env(
    tmp_path: Path, task_dir: Path, *, cpus=None, memory_mb=None, **kwargs
) -> LocalSandboxEnvironment:
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    return LocalSandboxEnvironment(
        environment_dir=task_dir / "environment",
        environment_name="escape",
        session_id="escape__test__env",
        trial_paths=paths,
        task_env_config=TaskEnvironmentConfig(workdir="/app", cpus=cpus, memory_mb=memory_mb),
        **kwargs,
    )


@pytest.fixture
async def sandbox(tmp_path, hello_task):
    env = make_env(tmp_path, hello_task, memory_mb=128, max_processes=48)
    await env.start(force_build=False)
    try:
        yield env
    finally:
        await env.stop(delete=True)


async def test_task_files_and_host_files_are_invisible(sandbox, hello_task, tmp_path):
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("secret")
    for command in (
        f"cat {hello_task}/solution/solve.sh",
        f"bash {hello_task}/solution/solve.sh",
        f"cat {hello_task}/tests/test.sh",
        f"cat {host_secret}",
        "cat /root/.bashrc /work/HELPERS.md",  # the host's /root and /work are not there
        "cat /etc/shadow",  # present (host /etc, read-only) but owned by a uid unmapped inside
    ):
        r = await sandbox.exec(command)
        assert r.return_code != 0, command
        assert "secret" not in r.stdout and "Hello" not in r.stdout
    # The task's tests and solution are not in the sandbox before verification.
    assert (await sandbox.exec("ls -A /tests /solution")).stdout.split() == ["/solution:", "/tests:"]


async def test_host_and_kernel_files_cannot_be_written(sandbox, tmp_path):
    for command in (
        f"echo x > {tmp_path}/escaped.txt",
        "echo 1 > /proc/sys/vm/drop_caches",
        "echo arl > /proc/sys/kernel/hostname",
        "echo x > /sys/kernel/mm/transparent_hugepage/enabled",
        "touch /usr/arl-escape /etc/arl-escape",
        "mount -o remount,rw /usr",
        "mount -t tmpfs none /mnt",
        "umount -l /etc",
        "unshare -m sh -c 'mount -o remount,rw /usr && touch /usr/arl-escape'",
    ):
        assert (await sandbox.exec(command)).return_code != 0, command
    assert not (tmp_path / "escaped.txt").exists() and not os.path.exists("/usr/arl-escape")
    # Creating dirs at the sandbox's root works (it is a tmpfs of its own) and never reaches the host's.
    assert (await sandbox.exec("mkdir -p /arl-escape-dir/x && ls -d /arl-escape-dir/x")).return_code == 0
    assert not os.path.exists("/arl-escape-dir")
    # Root inside is an unprivileged uid outside.
    uid_map = (await sandbox.exec("cat /proc/self/uid_map")).stdout.split()
    assert uid_map[0] == "0" and int(uid_map[1]) >= 65536


async def test_host_loopback_services_are_unreachable(sandbox):
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'"
        r = await sandbox.exec(probe)
        assert r.return_code != 0 and "Connection refused" in r.stderr
        assert (await sandbox.exec("ip -o link | cut -d: -f2")).stdout.split() == ["lo"]
        # Name lookups are refused at once and recorded.
        lookup = await sandbox.exec("python3 -c 'import socket; socket.getaddrinfo(\"pypi.org\", 443)'")
        assert lookup.return_code != 0
        log = sandbox.trial_paths.trial_dir / "arl_sandbox_network.jsonl"
        assert "pypi.org" in [json.loads(line)["name"] for line in log.read_text().splitlines()]
    finally:
        server.close()


async def test_memory_and_process_limits_hold(sandbox):
    # 512 MB against a 128 MB limit: killed by the cgroup or refused by the rlimit, never granted.
    hog = await sandbox.exec(
        'python3 -c \'b = bytearray(512 << 20); b[::4096] = b"x" * len(b[::4096]); print("granted")\''
    )
    assert hog.return_code != 0 and "granted" not in hog.stdout
    # A fork bomb stops at max_processes (48); the sandbox still answers afterwards.
    bomb = (
        "python3 -c '\nimport os, time\nn = 0\nwhile n < 500:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nprint(n, flush=True)\nos.killpg(0, 9)'"
    )
    r = await sandbox.exec(f"setsid --wait {bomb}", timeout_sec=60)
    forked = int(r.stdout.strip() or 0)
    assert 0 < forked < 48, (r.stdout, r.stderr)
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_processes_do_not_outlive_the_sandbox(tmp_path, hello_task):
    env = make_env(tmp_path, hello_task)
    await env.start(force_build=False)
    try:
        await env.exec("setsid nohup sleep 987.654 >/dev/null 2>&1 & disown")
        check = "for i in $(seq 100); do pgrep -f 'sleep 987.654' && break; sleep 0.05; done"
        assert (await env.exec(check)).return_code == 0
    finally:
        await env.stop(delete=True)
    out = await asyncio.create_subprocess_exec(
        "pgrep", "-f", "^sleep 987.654$", stdout=asyncio.subprocess.PIPE
    )
    assert (await out.communicate())[0] == b""
    assert not (tmp_path / "trial" / "sandbox").exists()


# The harness that starts a sandbox, killed outright once the sandbox holds a background process.
ORPHAN_HARNESS = """
import asyncio, sys
from pathlib import Path
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from arl.harbor import LocalSandboxEnvironment
from arl.harbor.testing import write_hello_task

async def main(root):
    task = write_hello_task(root / "tasks")
    paths = TrialPaths(root / "trial")
    paths.mkdir()
    env = LocalSandboxEnvironment(
        environment_dir=task / "environment", environment_name="orphan", session_id="orphan__test__env",
        trial_paths=paths, task_env_config=EnvironmentConfig(workdir="/app"),
    )
    await env.start(force_build=False)
    await env.exec("setsid nohup sleep 876.543 >/dev/null 2>&1 &")
    print("started", flush=True)
    await asyncio.sleep(600)

asyncio.run(main(Path(sys.argv[1])))
"""


async def pgrep(pattern: str) -> bytes:
    out = await asyncio.create_subprocess_exec("pgrep", "-f", pattern, stdout=asyncio.subprocess.PIPE)
    return (await out.communicate())[0]


async def test_a_killed_harness_leaves_no_sandbox_behind(tmp_path):
    harness = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ORPHAN_HARNESS, str(tmp_path), stdout=asyncio.subprocess.PIPE
    )
    assert harness.stdout is not None
    try:
        assert await asyncio.wait_for(harness.stdout.readline(), 60) == b"started\n"
        for _ in range(100):  # the background child may not have exec'd `sleep` yet
            if await pgrep("^sleep 876.543$"):
                break
            await asyncio.sleep(0.05)
        assert await pgrep("^sleep 876.543$")
    finally:
        harness.kill()  # SIGKILL: no stop, no cleanup of its own
        await harness.wait()
    for _ in range(100):
        if not await pgrep("^sleep 876.543$"):
            break
        await asyncio.sleep(0.05)
    assert await pgrep("^sleep 876.543$") == b""


def test_namespace_names_stay_a_stopped_sandboxs_own_while_pinned():
    """A freed namespace's inode number goes to the next namespace made; pinned, it cannot."""
    holder = subprocess.Popen(["unshare", "--pid", "--user", "--fork", "sleep", "60"])
    try:
        for _ in range(100):  # the holder's child, PID 1 of the new namespace
            children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
            if children and os.readlink(f"/proc/{children[0]}/ns/pid") != os.readlink("/proc/self/ns/pid"):
                break
            time.sleep(0.05)
        init = int(children[0])
        pidfd = os.pidfd_open(init)
        with pinned_namespaces(init, pidfd) as names:
            assert len(names) == 2
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            holder.wait(10)
            time.sleep(1.0)  # long enough for the kernel to free an unpinned namespace
            made = subprocess.run(
                [
                    "unshare",
                    "--pid",
                    "--user",
                    "--fork",
                    "sh",
                    "-c",
                    "readlink /proc/self/ns/pid /proc/self/ns/user",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert set(made).isdisjoint(names)
        os.close(pidfd)
    finally:
        holder.kill()
        holder.wait()


# -- whole trials ------------------------------------------------------------------------------------


async def run_trial(harbor_config, task: Path, script: str) -> tuple[object, dict]:
    loop = HarborAgentLoop(
        harbor_config(
            agent_import_path=SCRIPTED_AGENT_IMPORT_PATH,
            agent_kwargs={"script": script},
            policy={"max_attempts": 1},
        )
    )
    result = await loop.run(
        Task(id="t", messages=[], agent="harbor", metadata={"harbor_task_path": str(task)}), None, None, "r"
    )
    logs = list(Path(loop.config.trials_dir).rglob("scripted.json"))
    return result, json.loads(logs[-1].read_text()) if logs else {}


async def test_scripted_agent_cannot_use_the_solution(harbor_config, hello_task):
    script = (
        f"bash {hello_task}/solution/solve.sh; cat {hello_task}/solution/solve.sh | bash; "
        f"bash /solution/solve.sh; cp {hello_task}/tests/test.sh /app/; ls -A /tests /solution"
    )
    result, log = await run_trial(harbor_config, hello_task, script)
    assert not result.failed and result.reward == 0.0
    assert "No such file" in log["stderr"] and log["stdout"].split() == ["/solution:", "/tests:"]


@pytest.mark.parametrize(("mode", "tests_image"), [(None, False), ("separate", False), ("separate", True)])
async def test_verifier_modes_score_right_and_wrong_solutions(harbor_config, tmp_path, mode, tests_image):
    task = write_hello_task(tmp_path / "tasks", verifier_mode=mode, tests_image=tests_image)
    right, _ = await run_trial(harbor_config, task, HELLO_SOLUTION)
    wrong, _ = await run_trial(harbor_config, task, "echo 'Hello, moon!' > /app/hello.txt")
    assert (right.failed, right.reward) == (False, 1.0), right.error
    assert (wrong.failed, wrong.reward) == (False, 0.0), wrong.error


async def test_verifier_that_needs_the_network_fails_loudly(harbor_config, tmp_path):
    # A standard pytest verifier: install uv from the network, else score 0. It must not score 0 here.
    test_script = (
        "#!/bin/bash\n"
        "python3 -c 'import socket; socket.getaddrinfo(\"astral.sh\", 443)' "
        "|| { echo 0 > /logs/verifier/reward.txt; exit 1; }\n"
        "echo 1 > /logs/verifier/reward.txt\n"
    )
    task = write_hello_task(tmp_path / "tasks", test_script=test_script)
    result, _ = await run_trial(harbor_config, task, HELLO_SOLUTION)
    assert result.failed and result.failure_kind == "verifier_network"
    assert "astral.sh" in result.error and "network" in result.error


async def test_opt_in_route_reaches_exactly_the_routed_host_port(tmp_path, hello_task):
    async def hello(reader, writer):
        writer.write(b"from-host")
        await writer.drain()
        writer.close()

    routed = await asyncio.start_server(hello, "127.0.0.1", 0)
    other = await asyncio.start_server(hello, "127.0.0.1", 0)
    port = routed.sockets[0].getsockname()[1]
    other_port = other.sockets[0].getsockname()[1]
    env = make_env(tmp_path, hello_task, routes=[f"8123=127.0.0.1:{port}"])
    await env.start(force_build=False)
    try:
        read = (
            'python3 -c \'import socket,sys; s=socket.create_connection(("127.0.0.1", {}), 5); '
            "print(s.recv(100).decode())'"
        )
        r = await env.exec(read.format(8123))
        assert (r.return_code, r.stdout) == (0, "from-host\n"), r.stderr
        assert (await env.exec(read.format(other_port))).return_code != 0  # only the route, nothing else
    finally:
        await env.stop(delete=True)
        routed.close()
        other.close()
