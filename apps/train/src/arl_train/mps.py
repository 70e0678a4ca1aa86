"""CUDA MPS for `resources.shared_gpu="concurrent"`: a control daemon the run starts for itself.

Without MPS the GPU time-slices the kernels of the trainer's and the replica's processes; under one MPS
server they run side by side. Measured on one H200 (apps/bench/BENCHMARKS.md, "What makes `concurrent`
share the GPU"): beside the replica the trainer kept 82% of its solo rate under MPS, 53% without.

`resources.mps="start"` starts `nvidia-cuda-mps-control -d` with the run's own pipe folder (a short
path under /tmp: the daemon's sockets live there) and its log folder (`<output.dir>/mps/`: control.log
lists the server's start and every client), puts both in the environment of every process of the run
(so each CUDA process of the run becomes the server's client) and asks the daemon to quit at the end.
The GPU's compute mode is left as it is. The daemon carries the run's watchdog marker like every other
process of the run, so it ends with the driver even when the driver is SIGKILLed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 30.0


class MpsError(RuntimeError):
    """The MPS control daemon could not be started."""


@dataclass
class MpsDaemon:
    """A running control daemon: `env` makes a process its client."""

    pipe_dir: Path
    log_dir: Path
    env: dict[str, str]
    # What `export` replaced in this process's environment, for `stop` to put back.
    _replaced: dict[str, str | None] | None = None

    def export(self) -> None:
        """Put `env` in this process's environment, so that the processes it starts are clients."""
        self._replaced = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)

    def stop(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Ask the daemon to quit (it stops its server first), wait until it has, remove the pipe folder,
        and give back the environment `export` changed: a later run in this process (apps/bench runs
        several) must not point its CUDA processes at a daemon that is gone."""
        pids = [int(p.read_text().strip() or 0) for p in self.pipe_dir.glob("*.pid")]  # the daemon's own
        try:
            subprocess.run(
                [CONTROL],
                input="quit\n",
                text=True,
                env=os.environ | self.env,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
            deadline = time.monotonic() + timeout_s
            while any(pid and Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            shutil.rmtree(self.pipe_dir, ignore_errors=True)
            self._restore_environment()

    def _restore_environment(self) -> None:
        for key, value in (self._replaced or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._replaced = None


def start(log_dir: Path, timeout_s: float = START_TIMEOUT_S) -> MpsDaemon:
    """Start a control daemon whose log goes to `log_dir`; raises MpsError naming why it did not start."""
    binary = shutil.which(CONTROL)
    if binary is None:
        raise MpsError(f"{CONTROL} is not on PATH (it ships with the NVIDIA driver)")
    pipe_dir = Path(tempfile.mkdtemp(prefix="arl-mps-", dir="/tmp"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
    try:
        done = subprocess.run(
            [binary, "-d"],
            env=os.environ | env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(pipe_dir, ignore_errors=True)
        raise MpsError(f"{CONTROL} -d did not return within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        shutil.rmtree(pipe_dir, ignore_errors=True)
        raise MpsError(
            f"{CONTROL} -d exited {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}"
        )
    return MpsDaemon(pipe_dir, log_dir, env)


def clients_seen(log_dir: Path) -> int:
    """How many client connections the daemon's control.log records (its "NEW CLIENT" lines)."""
    log = log_dir / "control.log"
    if not log.is_file():
        return 0
    return sum("new client" in line.lower() for line in log.read_text(errors="replace").splitlines())
