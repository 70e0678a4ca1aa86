"""The app on GPUs with vLLM (skipped without CUDA): the colocated layout and the one-GPU default
(configs/gpu_1.toml as shipped: concurrent under the run's own MPS daemon, the trainer's SMs capped) on
one GPU and, with two GPUs, the split layout. Each runs a few steps of the tiny model and must end with
the engine holding exactly the trainer's weights (every tensor compared bit for bit); the capped trainer
checks its GEMMs again at every step.

    python -m pytest -q -m gpu tests/test_train_gpu.py
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from arl_train import mps
from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.e2e]
CONFIGS = Path(__file__).resolve().parents[1] / "apps" / "train" / "configs"
CONFIG = CONFIGS / "gpu_tiny.toml"


def _run(tmp_path, *overrides, config_file=CONFIG):
    pytest.importorskip("vllm")
    config = load_config(
        config_file,
        [f"output.dir={tmp_path}", "trainer.total_steps=3", "rollout.enforce_eager=true", *overrides],
    )
    return run(config, log=print)


def test_colocated_on_one_gpu(tmp_path):
    s = _run(tmp_path, "resources.colocate=true")
    assert s.layout["transport"] == "cuda_ipc" and s.steps == 3
    assert s.weights_equal_after_sync and s.weights_max_abs_diff == 0.0, s.weights_problems
    assert s.weights_prepacked == 0  # every engine tensor was compared
    assert {"sleep", "wake_weights", "wake_kv", "load"} <= s.sync_phases_ms.keys()


@pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason="no nvidia-cuda-mps-control on this machine")
def test_the_one_gpu_default_concurrent_under_the_runs_own_mps_daemon(tmp_path):
    pipes_before = set(Path("/tmp").glob("arl-mps-*"))
    s = _run(tmp_path, "actor.gemm_recheck_every=1", config_file=CONFIGS / "gpu_1.toml")
    assert s.layout["shared_gpu"] == "concurrent" and s.layout["transport"] == "cuda_ipc" and s.steps == 3
    assert s.weights_equal_after_sync and s.weights_max_abs_diff == 0.0, s.weights_problems
    # The capped trainer checked its GEMMs again at every step, beside the generating replica.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["gemm_recheck_s"] > 0 for r in rows), rows
    # The trainer rank and the replica's engine core were the daemon's clients; it quit at the end.
    assert mps.clients_seen(tmp_path / "mps") >= 2, (tmp_path / "mps" / "control.log").read_text()
    assert set(Path("/tmp").glob("arl-mps-*")) == pipes_before
    # none left
    assert subprocess.run(["pgrep", "-f", mps.CONTROL], capture_output=True, check=False).returncode == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the split layout needs two GPUs")
def test_split_over_two_gpus(tmp_path):
    s = _run(tmp_path)
    assert s.layout["transport"] == "nccl" and s.rollout["engine_versions"] == [3]
    assert s.weights_equal_after_sync and s.weights_max_abs_diff == 0.0, s.weights_problems
