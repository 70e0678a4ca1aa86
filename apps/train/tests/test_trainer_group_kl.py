"""KL under the app's FSDP trainer group: the follower ranks run the reference forwards collectively
(inside each training step, and on their own when rank 0 asks), so rank 0 gets one device's answer."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # group_ranks, for the spawned ranks

pytestmark = pytest.mark.slow  # two spawned gloo ranks


def test_followers_join_the_reference_forwards(tmp_path):
    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.distributed import spawn_local
    from arl_train.tiny_model import build_builtin_model
    from arl_train.trainer_group import probe_batch

    from group_ranks import kl_group

    model = build_builtin_model("tiny", tmp_path / "model")
    spawn_local(kl_group, 2, model, tmp_path, backend="gloo")
    leader = torch.load(tmp_path / "leader.pt", weights_only=False)
    assert torch.load(tmp_path / "follower.pt", weights_only=False) == {"train": 1, "ref_log_probs": 1, "stop": 1}
    assert leader["metrics"]["kl_ref_mean"] == 0.0  # step 1: the reference is the initial policy
    single = HFPolicy(model, TrainerConfig(mixed_precision="none", algorithm=AlgorithmConfig(kl_coef=0.1)))
    assert torch.allclose(leader["ref"], single.reference_log_probs(probe_batch([1, 2, 3, 4], [5, 6, 7, 8, 9])), atol=1e-6)
