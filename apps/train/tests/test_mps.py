"""arl_train.mps: the run's own MPS control daemon, started and stopped through its command line.

The NVIDIA binary is stood in for by a script that records how it was called (its environment and its
standard input), so these tests check what the app does with it: the pipe and log folders it hands the
daemon, the environment that makes the run's processes its clients, the quit at the end, and a clear
error when it does not start. The real daemon runs in tests/test_train_gpu.py.
"""

import os
import stat
from pathlib import Path

import pytest

from arl_train import mps

FAKE_CONTROL = """#!/bin/sh
# Records each call: its arguments, the MPS folders it was given, and what came on stdin.
{{ echo "args=$*"; echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"; echo "log=$CUDA_MPS_LOG_DIRECTORY"; }} >> {calls}
if [ "$1" = "-d" ]; then
  echo "[2026-12-05 05:00:00.000 Control 1] NEW CLIENT 2 from user 0: Server already exists" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  exit {exit_code}
fi
cat >> {calls}
"""  # noqa: E501 - the log line is nvidia-cuda-mps-control's own


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """Put a stand-in `nvidia-cuda-mps-control` first on PATH; returns (calls file, set its exit code)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()

    def install(exit_code: int = 0) -> Path:
        script = bin_dir / mps.CONTROL
        script.write_text(FAKE_CONTROL.format(calls=calls, exit_code=exit_code))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return calls

    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return install


def test_start_hands_the_daemon_its_folders_and_stop_asks_it_to_quit(tmp_path, fake_control):
    calls = fake_control()
    daemon = mps.start(tmp_path / "out" / "mps")
    pipe = Path(daemon.env["CUDA_MPS_PIPE_DIRECTORY"])
    assert daemon.env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "out" / "mps")
    assert pipe.is_dir() and pipe.parent == Path("/tmp")  # short: the daemon's sockets live there
    assert calls.read_text().splitlines() == ["args=-d", f"pipe={pipe}", f"log={tmp_path / 'out' / 'mps'}"]
    assert mps.clients_seen(daemon.log_dir) == 1
    daemon.stop()
    assert calls.read_text().splitlines()[3:] == [
        "args=",
        f"pipe={pipe}",
        f"log={tmp_path / 'out' / 'mps'}",
        "quit",
    ]
    assert not pipe.exists()


def test_stop_gives_back_the_environment_export_changed(tmp_path, fake_control, monkeypatch):
    # apps/bench runs several runs in one process: the one after an MPS run must not inherit its variables.
    fake_control()
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", "/somewhere/else")
    daemon = mps.start(tmp_path / "mps")
    daemon.export()
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon.pipe_dir)
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps")
    daemon.stop()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == "/somewhere/else"


def test_a_daemon_that_fails_to_start_is_an_error_with_its_words(tmp_path, fake_control):
    fake_control(exit_code=3)
    before = set(Path("/tmp").glob("arl-mps-*"))
    with pytest.raises(mps.MpsError, match="exited 3"):
        mps.start(tmp_path / "mps")
    assert set(Path("/tmp").glob("arl-mps-*")) == before  # its pipe folder was removed


def test_no_control_binary_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        mps.start(tmp_path / "mps")
