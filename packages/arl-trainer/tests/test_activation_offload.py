"""Activation offload (arl.trainer.offload): the update is unchanged, activations cross, weights stay.

The backends install the hooks on CUDA only (`activation_offload` is a no-op elsewhere); the hooks
themselves run on any device, so here they are exercised on the CPU (host → host copies): same loss
and gradients bit for bit, with and without activation checkpointing.
"""

import copy

import pytest
import torch
from trainer_helpers import random_batch

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.config import OptimConfig
from arl.trainer.model import PackedCausalLM, apply_activation_checkpointing
from arl.trainer.offload import HostActivationOffload, _is_weight
from arl.trainer.packed import pack_rows

torch.set_num_threads(1)


def test_activation_offload_flag_is_a_noop_on_cpu(tiny_model_dir):
    batch = random_batch(seed=5)
    out = []
    for offload in (False, True):
        cfg = TrainerConfig(
            optim=OptimConfig(lr=1e-2, grad_clip=1e9),
            mixed_precision="none",
            max_tokens_per_microbatch=40,
            activation_offload=offload,
        )
        policy = HFPolicy(tiny_model_dir, cfg)
        metrics = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
        assert metrics.get("offloaded_gib", 0.0) == 0.0  # nothing leaves the CPU
        out.append((metrics["loss"], {n: p.grad.clone() for n, p in policy.model.named_parameters()}))
    assert out[0][0] == out[1][0]
    for name, g in out[0][1].items():
        assert torch.equal(g, out[1][1][name]), name


def _grads(packed, mb, weights, hooks=None):
    packed.zero_grad(set_to_none=True)
    if hooks is None:
        logp, entropy = packed(mb)
    else:
        with hooks:
            logp, entropy = packed(mb)
    loss = (logp * weights).sum() + 0.1 * entropy.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in packed.named_parameters()}


def _offload_run(model_dir, checkpointing):
    """One packed forward/backward with and without the hooks (on the CPU); returns the hooks."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_activation_checkpointing(model, checkpointing)
    packed = PackedCausalLM(model)
    batch = random_batch(seed=6)
    mb = pack_rows(batch, list(range(batch.input_ids.shape[0])))
    weights = torch.randn(mb.num_loss_tokens, generator=torch.Generator().manual_seed(0))
    loss, grads = _grads(packed, mb, weights)
    hooks = HostActivationOffload(pin_memory=False)
    loss_off, grads_off = _grads(packed, mb, weights, hooks)
    assert torch.equal(loss, loss_off)
    for name, g in grads.items():
        assert torch.equal(g, grads_off[name]), name
    return hooks


@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_hooks_offload_activations_keep_weights_and_change_nothing(tiny_model_dir, checkpointing):
    hooks = _offload_run(tiny_model_dir, checkpointing)
    assert hooks.offloaded > 0 and hooks.offloaded_bytes > 0
    assert hooks.kept > 0  # the weights the linears and the head saved stayed where they are


def test_full_checkpointing_leaves_only_layer_inputs_to_offload(tiny_model_dir):
    none, full = (_offload_run(tiny_model_dir, mode) for mode in ("none", "full"))
    assert full.offloaded_bytes < none.offloaded_bytes / 2


def test_weights_and_their_casts_are_kept_and_a_tensor_saved_twice_crosses_once():
    w = torch.nn.Parameter(torch.randn(4, 4))
    x0 = torch.randn(3, 4, requires_grad=True)
    x = x0 * 1.0  # an activation (a leaf that requires grad counts as a parameter)
    assert _is_weight(w) and _is_weight(w.to(torch.bfloat16)) and _is_weight(w.t())
    assert not _is_weight(x) and not _is_weight(x.t()) and not _is_weight(torch.randn(3))
    hooks = HostActivationOffload(pin_memory=False)
    with hooks:
        a = torch.sin(x)  # saves x
        b = a * a.sum()  # saves a (twice, as both operands' partner) and a.sum()
        c = a @ w  # saves a again, and w (kept)
    (b.sum() + c.sum()).backward()
    assert hooks.kept == 1
    assert hooks.offloaded == 3  # x, a (once), a.sum()
    want = torch.cos(x.detach()) * (
        torch.ones(3, 4) * torch.sin(x.detach()).sum()
        + torch.sin(x.detach()).sum()
        + w.detach().sum(1)[None, :]
    )
    assert torch.allclose(x0.grad, want, atol=1e-5)


def test_offload_preserves_the_update_with_checkpointing_inside_the_backend(tiny_model_dir):
    """The backend's own path with the hooks forced on (as on CUDA): same update as without."""
    batch = random_batch(seed=7)
    results = []
    for offload in (False, True):
        cfg = TrainerConfig(
            optim=OptimConfig(lr=1e-2, grad_clip=1e9),
            mixed_precision="none",
            max_tokens_per_microbatch=40,
            activation_checkpointing="selective",
        )
        policy = HFPolicy(tiny_model_dir, cfg)
        if offload:
            made = []

            def forced(policy=policy, made=made):
                made.append(HostActivationOffload(pin_memory=False))
                return made[-1]

            policy._offload = forced
        metrics = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
        assert "offloaded_gib" not in metrics  # the flag is off: the hooks were forced, not configured
        results.append(copy.deepcopy({n: p.detach() for n, p in policy.model.named_parameters()}))
        if offload:
            assert made and all(h.offloaded > 0 for h in made)
    for name, p in results[0].items():
        assert torch.equal(p, results[1][name]), name
