"""A run leaves nothing behind: after the driver dies (SIGKILL included), no process of the run remains."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from arl_train.watchdog import MARKER, run_processes

APP = Path(__file__).resolve().parents[1] / "apps" / "train" / "__main__.py"


def _wait(predicate, timeout_s: float, step_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def _env(run_id: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != MARKER} | {MARKER: run_id}


def test_watchdog_ends_the_children_of_a_sigkilled_driver(tmp_path):
    run_id = uuid.uuid4().hex
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from arl_train import watchdog
        watchdog.start()
        subprocess.Popen(["sleep", "300"])                            # a plain child
        subprocess.Popen(["sleep", "301"], start_new_session=True)   # one that left the process group
        print("ready", flush=True)
        time.sleep(300)
    """)], env=_env(run_id), stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        assert len(run_processes(run_id, exclude={driver.pid}, nested=True)) == 2
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        assert _wait(lambda: not run_processes(run_id, nested=True), 10), run_processes(run_id, nested=True)
    finally:
        driver.kill()


def test_watchdog_stop_sweeps_leftovers_and_spares_the_driver():
    run_id = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess, sys
        from arl_train import watchdog
        guard = watchdog.start()
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        guard.stop()
        print(child.wait(10), flush=True)
    """)], env=_env(run_id), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(-signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.e2e
def test_sigkill_of_the_app_driver_leaves_no_ray_process(tmp_path):
    run_id = uuid.uuid4().hex
    # Ray's socket paths must stay under the AF_UNIX limit: a short temp dir, not pytest's tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="arlw-", dir="/tmp")
    env = _env(run_id) | {"ARL_RAY_TMP": ray_tmp}
    driver = subprocess.Popen(
        [sys.executable, str(APP), "rollout.engine=torch", "actor.ppo_mini_batch_size=2", "rollout.n=2",
         "rollout.max_tokens=8", "trainer.total_steps=1000", f"output.dir={tmp_path / 'out'}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        def actors_up() -> bool:
            titles = []
            for pid in run_processes(run_id, exclude={driver.pid}, nested=True):
                try:
                    titles.append(Path(f"/proc/{pid}/cmdline").read_bytes())
                except OSError:
                    pass
            return any(b"RolloutActor" in t for t in titles) and any(b"raylet" in t for t in titles)

        assert _wait(actors_up, 180, 0.5), "the run did not start its actors"
        assert len(run_processes(run_id, exclude={driver.pid}, nested=True)) >= 5  # GCS, raylet, agents, actors
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        killed_at = time.monotonic()
        assert _wait(lambda: not run_processes(run_id, nested=True), 15), [
            Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in run_processes(run_id, nested=True)
        ]
        assert time.monotonic() - killed_at < 15
    finally:
        driver.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
