"""The app with two FSDP2 trainer ranks on two GPUs (NCCL); skipped without them.

    python -m pytest -q -m gpu tests/test_train_fsdp_gpu.py

Two GPUs: the trainer ranks hold both and the rollout runs the in-tree torch engine on the CPU (weights
over the "cpu" transport); three or more: a vLLM replica on its own GPU (weights over NCCL from rank 0).
Each run must train, consume its samples once, end with the engine holding exactly the trainer's
weights and write the sharded checkpoint with its HF export.
"""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from arl_train import ledger
from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.e2e]
CONFIG = Path(__file__).resolve().parents[1] / "apps" / "train" / "configs" / "gpu_tiny.toml"


def _run(tmp_path, *overrides):
    config = load_config(
        CONFIG, [f"output.dir={tmp_path}", "trainer.total_steps=3", "resources.trainer_gpus=2", *overrides]
    )
    summary = run(config, log=print)
    _, consumed = ledger.read(tmp_path / "ledger")
    assert len(consumed) == summary.samples_consumed == 3 * config.actor.ppo_mini_batch_size
    assert max(Counter(c["uid"] for c in consumed).values()) == 1
    assert summary.steps == 3 and summary.rollout["engine_versions"] == [3]
    assert summary.weights_equal_after_sync and summary.weights_max_abs_diff == 0.0, summary.weights_problems
    checkpoint = Path(summary.checkpoint)
    assert (checkpoint / "dcp").is_dir() and (checkpoint / "rng_rank1.pt").is_file()
    assert (checkpoint / "model.safetensors").is_file()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == 3
    return summary


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two trainer ranks need two GPUs")
def test_two_ranks_on_two_gpus_with_a_cpu_engine(tmp_path):
    s = _run(tmp_path, "rollout.engine=torch", "rollout.device=cpu")
    assert s.layout["trainer_gpus"] == 2 and s.layout["transport"] == "cpu"


@pytest.mark.skipif(
    torch.cuda.device_count() < 3, reason="two trainer ranks and a vLLM replica need three GPUs"
)
def test_two_ranks_and_a_vllm_replica_on_three_gpus(tmp_path):
    pytest.importorskip("vllm")
    s = _run(tmp_path, "rollout.enforce_eager=true")
    assert s.layout["transport"] == "nccl"
