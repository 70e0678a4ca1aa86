"""Test support for app runs: one Ray cluster that several runs of a test chain connect to.

Each `arl_train.run.run` starts and stops its own Ray unless `ray.address` names a running cluster.
A test chain whose runs have the same placement (a run and its resume, say) starts one head with
`ray_head()` and passes `ray.address=<address>` to every run: Ray starts once, not once per run. A run
connected to the head disconnects at its end (Ray ends the job's workers then); the head's processes
are ended when the context exits, by the tag they all carry (`arl_train.watchdog`), never by name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from arl.sync.net import free_port
from arl_train import watchdog

START_TIMEOUT_S = 300.0
# Ray's raylet gives its agents 15 s to come up and aborts otherwise; on a loaded 2-core machine that
# fails now and then. A head that could not start is started again (the test itself never is).
START_ATTEMPTS = 3


@contextmanager
def ray_head(num_cpus: int | None = None) -> Iterator[str]:
    """A Ray head of this test's own, for `ray.address=`; yields its address, ends it on exit."""
    for attempt in range(1, START_ATTEMPTS + 1):
        run_id = f"arl-test-ray-{uuid.uuid4().hex[:12]}"
        # Ray's socket paths must stay under the AF_UNIX limit: a short temp dir.
        temp_dir = tempfile.mkdtemp(prefix="arlh-", dir="/tmp")
        address, problem = _start(run_id, num_cpus or os.cpu_count() or 1, temp_dir)
        if address is not None:
            break
        watchdog.sweep(run_id)
        shutil.rmtree(temp_dir, ignore_errors=True)
        print(
            f"arl_train.testing: Ray head start {attempt}/{START_ATTEMPTS} failed: {problem}", file=sys.stderr
        )
    else:
        raise RuntimeError(f"a Ray head did not start in {START_ATTEMPTS} attempts: {problem}")
    try:
        yield address
    finally:
        # The head is the test's alone: 2 s after SIGTERM, then SIGKILL. Stopping gracefully, `ray start
        # --block`, the GCS and the runtime-env agent take ~10 s, which no test needs waiting for.
        watchdog.sweep(run_id, grace_s=2.0)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _start(run_id: str, num_cpus: int, temp_dir: str) -> tuple[str | None, str]:
    """`ray start --head --block` tagged with `run_id`; (address, "") once it is up, else (None, why)."""
    port, agent_grpc, agent_http, metrics, runtime_env = (free_port() for _ in range(5))
    env = {k: v for k, v in os.environ.items() if k != watchdog.MARKER} | {
        watchdog.MARKER: run_id,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",  # as arl_train.run sets it for its own Ray
    }
    ray_cli = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            # Fixed agent ports: the raylet then need not wait for its agents to write theirs to files.
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--dashboard-agent-listen-port={agent_http}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    lines: list[str] = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:  # exited: the start failed
            proc.wait(30)
            return None, f"ray start exited {proc.returncode}: {''.join(lines[-5:]).strip()}"
        lines.append(line)
        if "Ray runtime started" in line:
            # Keep draining its output so the head never blocks on a full pipe.
            _drain(proc)
            return f"127.0.0.1:{port}", ""
    return None, f"ray start took over {START_TIMEOUT_S:.0f} s: {''.join(lines[-5:]).strip()}"


def _drain(proc: subprocess.Popen[str]) -> None:
    import threading

    def read() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            pass

    threading.Thread(target=read, daemon=True).start()
