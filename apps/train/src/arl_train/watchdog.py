"""Leave nothing behind: a small process that ends every process of a run once its driver is gone.

`start()` tags the driver's environment with `ARL_RUN_ID=<id>` (`<parent id>.<id>` when the driver
already carries one, e.g. from a test that wants to find the run's processes); every process the run starts inherits
it (Ray's GCS, raylet, dashboard and agents, the actors' workers, engine subprocesses). It then spawns
this file as a script in its own session (so Ctrl-C in a terminal does not reach it) with a
pipe from the driver. When the pipe reaches EOF (the driver exited, crashed or was SIGKILLed) or the
driver's pid disappears, the watchdog SIGTERMs every process carrying the tag, SIGKILLs what is left
after a grace period, and exits. `Watchdog.stop()` (end of a run) does the same sweep and waits for it.

Linux-only (/proc); elsewhere `start()` still tags the environment but the sweep finds nothing.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARKER = "ARL_RUN_ID"
GRACE_S = 2.0
POLL_S = 0.5


def run_processes(run_id: str, exclude: set[int] = frozenset(), *, nested: bool = False) -> list[int]:
    """Pids of live processes whose environment carries `ARL_RUN_ID=run_id` (this process excluded);
    with `nested`, also those of runs started under it (`ARL_RUN_ID=run_id.*`)."""
    needle = b"\0" + f"{MARKER}={run_id}".encode()
    needles = (needle + b"\0", needle + b".") if nested else (needle + b"\0",)
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == os.getpid() or pid in exclude:
            continue
        try:
            environ = (entry / "environ").read_bytes() + b"\0"
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours
        if state != "Z" and any(n in b"\0" + environ for n in needles):
            found.append(pid)
    return found


def sweep(run_id: str, exclude: set[int] = frozenset(), grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM the run's processes, then SIGKILL those still alive after `grace_s`; returns who was hit."""
    targets = run_processes(run_id, exclude)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 0.0)
        while time.monotonic() < deadline and run_processes(run_id, exclude):
            time.sleep(0.1)
        if not run_processes(run_id, exclude):
            break
    return targets


class Watchdog:
    """The driver's side: holds the pipe whose EOF tells the watchdog process the driver is gone."""

    def __init__(self, run_id: str, process: subprocess.Popen[bytes]) -> None:
        self.run_id = run_id
        self.process = process

    def stop(self, timeout_s: float = 30.0) -> None:
        """Sweep the run's leftovers now (the driver stays) and wait for the watchdog to exit."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start(run_id: str | None = None) -> Watchdog:
    """Tag this process's environment with the run id (from $ARL_RUN_ID if set) and start the watchdog.

    Call it before starting Ray so that every process of the run inherits the tag.
    """
    # A fresh id per run, nested under an inherited one: a test or harness that set $ARL_RUN_ID finds
    # the run's processes by prefix, and the sweep never matches the driver's own ancestors.
    run_id = run_id or ".".join(filter(None, (os.environ.get(MARKER), uuid.uuid4().hex[:12])))
    os.environ[MARKER] = run_id
    env = {k: v for k, v in os.environ.items() if k != MARKER}  # the watchdog must not match itself
    process = subprocess.Popen(
        # Run as a plain script (stdlib only): it works wherever the driver's Python does, installed or not.
        [sys.executable, str(Path(__file__).resolve()), "--run-id", run_id, "--driver", str(os.getpid())],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    return Watchdog(run_id, process)


def _driver_gone(pipe: int, driver: int) -> bool:
    readable, _, _ = select.select([pipe], [], [], POLL_S)
    if readable and not os.read(pipe, 4096):
        return True  # EOF: the driver closed the pipe or died
    try:
        os.kill(driver, 0)
    except ProcessLookupError:
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="end every process of an arl run once its driver is gone")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--driver", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while not _driver_gone(sys.stdin.fileno(), args.driver):
        pass
    # The driver itself (if alive: a clean stop) is spared; everything else tagged with the run goes.
    sweep(args.run_id, exclude={args.driver})
    return 0


if __name__ == "__main__":
    sys.exit(main())
