"""FSDP2 backend on CPU with gloo: 2 ranks make the same update as one device; sharded checkpoints
saved on 2 ranks resume on 1 with the same next loss; weights stream out one full tensor at a time; a
NaN gradient on one rank makes every rank skip the update."""

import json

import pytest
import torch
from trainer_helpers import config, one_rank_resume, random_batch, two_rank_run

from arl.sync.net import free_port
from arl.trainer import HFPolicy
from arl.trainer.distributed import DistributedSpec, spawn_local


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


def test_fsdp2_two_ranks_match_one_device_and_resume_on_one_rank(tiny_model_dir, tmp_path):
    spawn_local(two_rank_run, 2, tiny_model_dir, tmp_path, backend="gloo")
    two = torch.load(tmp_path / "two_ranks.pt", weights_only=False)

    # 1 vs 2 ranks: the same gradient and the same update (fp32)
    single = HFPolicy(tiny_model_dir, config())
    b1 = random_batch(seed=1)
    m1 = single.train_step(b1, mini_batch_rows=b1.input_ids.shape[0])
    assert two["m1"]["loss"] == pytest.approx(m1["loss"], rel=1e-5)
    # the default proximal mode reuses each rank's own forwards; their sum over ranks is the whole batch's
    assert two["m1"]["proximal_reused"] == m1["proximal_reused"] == 1.0
    assert two["m1"]["behaviour_proximal_abs_diff"] == pytest.approx(
        m1["behaviour_proximal_abs_diff"], rel=1e-5
    )
    assert two["m1"]["microbatches"] == m1["microbatches"] / 2 or two["m1"]["microbatches"] >= 1
    for name, p in single.model.named_parameters():
        assert rel(two["grads"][name], p.grad) <= 1e-5, name
        assert rel(two["params"][name], p.detach()) <= 1e-5, name

    # weights out through arl-sync: full tensors, HF names, cast to the rollout dtype before the gather
    assert set(two["synced"]) == {n for n, _ in single.model.named_parameters()}
    for name, t in two["synced"].items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, two["params"][name].to(torch.bfloat16)), name

    # HF export: an ordinary folder transformers (and vLLM) load, holding the trained weights
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    for name, p in exported.named_parameters():
        assert torch.equal(p.detach(), two["params"][name]), name

    # sharded checkpoint of 2 ranks, resumed on 1: the same next loss and the same next update
    # (one rank: in this process, its own single-member gloo group)
    import torch.distributed as dist

    try:
        one_rank_resume(
            DistributedSpec("127.0.0.1", free_port(), 0, 1, backend="gloo"), tiny_model_dir, tmp_path
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    one = torch.load(tmp_path / "one_rank.pt", weights_only=False)
    assert one["state"] == {"step": 1, "version": 3}
    assert one["m2"]["loss"] == pytest.approx(two["m2"]["loss"], rel=1e-5)
    for name, t in two["after"].items():
        assert rel(one["after"][name], t) <= 1e-5, name
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())["version"] == 3

    # a NaN on one rank: every rank skipped that update and kept its weights
    assert [(tmp_path / f"nan_skip_rank{r}.txt").read_text() for r in (0, 1)] == ["True", "True"]
