"""The colocated app's settle under the FSDP trainer group: rank 0's `settle_optimizer_offload` makes
every rank finish its optimizer state's overlapped way out (and free that memory) before it returns,
so no replica's KV cache wakes into memory a follower still holds."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # group_ranks, for the spawned ranks

pytestmark = pytest.mark.slow  # two spawned gloo ranks


def test_rank_zeros_settle_runs_on_every_rank(tmp_path):
    from arl.trainer.distributed import spawn_local
    from arl_train.tiny_model import build_builtin_model

    from group_ranks import settle_group

    model = build_builtin_model("tiny", tmp_path / "model")
    spawn_local(settle_group, 2, model, tmp_path, backend="gloo")
    leader = torch.load(tmp_path / "settle_rank0.pt", weights_only=False)
    follower = torch.load(tmp_path / "settle_rank1.pt", weights_only=False)
    assert leader["settled"] == [0] and follower["settled"] == [1]
    assert follower["counts"] == {"train": 1, "settle": 1, "stop": 1}
    assert leader["counts"]["waited_s"] >= 0.0
