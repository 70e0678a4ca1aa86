"""The reference policy under FSDP2 (2 ranks, gloo, fp32): the same reference log probs, KL metrics
and gradient as one device, for a reference copied from the initial shards and one loaded from a folder."""

import pytest
import torch
from trainer_helpers import kl_config, random_batch, two_rank_reference

from arl.trainer import HFPolicy
from arl.trainer.distributed import spawn_local

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(1)
    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    cfg.initializer_range = 0.3
    path = tmp_path_factory.mktemp("other")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.slow  # two spawned gloo ranks (~1 min of wall time on 2 cores)
def test_two_ranks_give_the_reference_of_one_device(tiny_model_dir, other_model_dir, tmp_path):
    spawn_local(two_rank_reference, 2, tiny_model_dir, other_model_dir, tmp_path, backend="gloo")
    two = torch.load(tmp_path / "reference.pt", weights_only=False)
    batch = random_batch(seed=4)
    rows = batch.input_ids.shape[0]

    own = HFPolicy(tiny_model_dir, kl_config(kl_coef=0.5))
    assert torch.allclose(two["own_ref"], own.reference_log_probs(batch), atol=1e-6)
    assert two["own_metrics"]["kl_ref_mean"] == 0.0  # step 1: the reference is the initial policy
    assert torch.equal(two["own_ref_after"], two["own_ref"]) and two["frozen"]
    for name, p in own.model.named_parameters():  # the reference's shards are the initial weights
        assert torch.equal(two["own_ref_params"][name], p.detach()), name

    other = HFPolicy(
        tiny_model_dir, kl_config(kl_coef=0.5, kl_estimator="k1"), reference_path=other_model_dir
    )
    assert torch.allclose(two["other_ref"], other.reference_log_probs(batch), atol=1e-6)
    m = other.train_step(batch, mini_batch_rows=rows)
    assert two["other_metrics"]["kl_ref_mean"] == pytest.approx(m["kl_ref_mean"], rel=1e-5)
    assert abs(m["kl_ref_mean"]) > 0.01
    assert two["other_metrics"]["loss"] == pytest.approx(m["loss"], rel=1e-5)
    for name, p in other.model.named_parameters():
        assert rel(two["grads"][name], p.grad) <= 1e-5, name
