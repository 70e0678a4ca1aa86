"""A run leaves nothing behind: after the driver dies (SIGKILL included), no process of the run remains.

The watchdog on plain child processes here; on a whole app run (its own Ray, its actors), the fault
chain's driver SIGKILL (tests/test_faults.py::test_sigkill_of_the_app_driver_leaves_no_ray_process)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from arl_train.watchdog import MARKER, run_processes


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
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import subprocess, sys, time
        from arl_train import watchdog
        watchdog.start()
        subprocess.Popen(["sleep", "300"])                            # a plain child
        subprocess.Popen(["sleep", "301"], start_new_session=True)   # one that left the process group
        print("ready", flush=True)
        time.sleep(300)
    """),
        ],
        env=_env(run_id),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout.readline().strip() == "ready"
        # Both children, once /proc shows them (a child between fork and exec can be briefly unreadable there).
        assert _wait(lambda: len(run_processes(run_id, exclude={driver.pid}, nested=True)) == 2, 10), (
            run_processes(run_id, exclude={driver.pid}, nested=True)
        )
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        assert _wait(lambda: not run_processes(run_id, nested=True), 10), run_processes(run_id, nested=True)
    finally:
        driver.kill()


def test_watchdog_stop_sweeps_leftovers_and_spares_the_driver():
    run_id = uuid.uuid4().hex
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import os, subprocess, sys
        from arl_train import watchdog
        guard = watchdog.start()
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        guard.stop()
        print(child.wait(10), flush=True)
    """),
        ],
        env=_env(run_id),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(-signal.SIGTERM)
