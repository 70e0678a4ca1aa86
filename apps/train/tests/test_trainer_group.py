"""The app's FSDP trainer group (two spawned gloo ranks): what rank 0 asks, every follower does.

KL: the followers run the reference forwards collectively (inside each training step, and on their
own when rank 0 asks), so rank 0 gets one device's answer. Settle: rank 0's `settle_optimizer_offload`
makes every rank finish its optimizer state's overlapped way out (and free that memory) before it
returns, so no replica's KV cache wakes into memory a follower still holds."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # group_ranks, for the spawned ranks

pytestmark = pytest.mark.slow  # two spawned gloo ranks


def _run_group(body, tmp_path):
    """Two gloo ranks running `body` on the built-in tiny model; returns the model's folder."""
    from arl.trainer.distributed import spawn_local
    from arl_train.tiny_model import build_builtin_model

    model = build_builtin_model("tiny", tmp_path / "model")
    spawn_local(body, 2, model, tmp_path, backend="gloo")
    return model


def test_followers_join_the_reference_forwards(tmp_path):
    from group_ranks import kl_group

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.group import probe_batch

    model = _run_group(kl_group, tmp_path)
    leader = torch.load(tmp_path / "leader.pt", weights_only=False)
    assert torch.load(tmp_path / "follower.pt", weights_only=False) == {
        "train": 1,
        "ref_log_probs": 1,
        "stop": 1,
    }
    assert leader["metrics"]["kl_ref_mean"] == 0.0  # step 1: the reference is the initial policy
    single = HFPolicy(model, TrainerConfig(mixed_precision="none", algorithm=AlgorithmConfig(kl_coef=0.1)))
    assert torch.allclose(
        leader["ref"], single.reference_log_probs(probe_batch([1, 2, 3, 4], [5, 6, 7, 8, 9])), atol=1e-6
    )


def test_rank_zeros_settle_runs_on_every_rank(tmp_path):
    from group_ranks import settle_group

    _run_group(settle_group, tmp_path)
    leader = torch.load(tmp_path / "settle_rank0.pt", weights_only=False)
    follower = torch.load(tmp_path / "settle_rank1.pt", weights_only=False)
    assert leader["settled"] == [0] and follower["settled"] == [1]
    assert follower["counts"] == {"train": 1, "settle": 1, "stop": 1}
    assert leader["counts"]["waited_s"] >= 0.0
