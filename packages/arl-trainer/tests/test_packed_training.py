"""Packed micro-batched training equals the padded one-batch computation (fp32, CPU)."""

import copy

import pytest
import torch
from trainer_helpers import random_batch

from arl.trainer import HFPolicy, TrainerConfig, assemble_batch
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.algorithms import token_log_probs
from arl.trainer.config import OptimConfig
from arl.trainer.loss_agg import Denominators, aggregate
from arl.trainer.model import PackedCausalLM
from arl.trainer.packed import pack_rows


def test_packed_log_probs_and_gradients_equal_padded(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    padded_model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    packed = PackedCausalLM(copy.deepcopy(padded_model))
    batch = random_batch()
    weights = torch.randn(batch.loss_mask.shape)
    ref = token_log_probs(
        padded_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch.input_ids
    )
    (ref * batch.loss_mask * weights).sum().backward()
    rows = list(range(batch.input_ids.shape[0]))
    total = 0.0
    for part in (rows[::3], rows[1::3], rows[2::3]):  # three packed micro-batches, rows in mixed order
        mb = pack_rows(batch, part[::-1])
        logp, _ = packed(mb)
        assert torch.allclose(logp, mb.gather(ref), atol=1e-5), (logp - mb.gather(ref)).abs().max()
        loss = (logp * mb.gather(weights)).sum()
        loss.backward()
        total += float(loss.detach())
    assert total == pytest.approx(float((ref * batch.loss_mask * weights).sum().detach()), rel=1e-5)
    grads = dict(packed.hf.named_parameters())
    for name, p in padded_model.named_parameters():
        g = grads[name].grad
        assert torch.allclose(g, p.grad, atol=1e-5, rtol=1e-4), name


def step_grads(model_dir, batch, version=0, proximal_mode="recompute", mini_batch_rows=None, **cfg):
    config = TrainerConfig(
        optim=OptimConfig(lr=1e-2, grad_clip=1e9),
        algorithm=AlgorithmConfig(proximal_mode=proximal_mode),
        **cfg,
    )
    policy = HFPolicy(model_dir, config)
    policy.version = version
    metrics = policy.train_step(batch, mini_batch_rows=mini_batch_rows or batch.input_ids.shape[0])
    return (
        {n: p.grad.clone() for n, p in policy.model.named_parameters()},
        dict(policy.model.named_parameters()),
        metrics,
    )


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_one_vs_many_microbatches_same_update(tiny_model_dir, mode):
    batch = random_batch(seed=1)
    g1, p1, m1 = step_grads(tiny_model_dir, batch, loss_agg_mode=mode, max_tokens_per_microbatch=4096)
    gk, pk, mk = step_grads(tiny_model_dir, batch, loss_agg_mode=mode, max_tokens_per_microbatch=24)
    assert m1["microbatches"] == 1 and mk["microbatches"] >= 4
    for name in g1:
        assert rel(gk[name], g1[name]) <= 1e-5, name
        # Looser for the weights after the step: Adam's normalised step turns rounding in near-zero
        # gradients into differences of up to lr (the fused attention kernel rounds unlike the math one).
        assert rel(pk[name].detach(), p1[name].detach()) <= 3e-5, name
    assert mk["loss"] == pytest.approx(m1["loss"], rel=1e-5)


def test_loss_aggregation_modes_match_their_definitions():
    loss = torch.tensor([1.0, 2.0, 3.0, 10.0])
    seq = torch.tensor([0, 0, 0, 1])
    denom = Denominators(tokens=8, seqs=4, norm_len=5)
    assert aggregate(loss, seq, "token-mean", denom).item() == pytest.approx(16 / 8)
    assert aggregate(loss, seq, "seq-mean-token-mean", denom).item() == pytest.approx((2.0 + 10.0) / 4)
    assert aggregate(loss, seq, "seq-mean-token-sum-norm", denom).item() == pytest.approx(16 / (4 * 5))
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(loss, seq, "sum", denom)
    d = Denominators.from_loss_mask(torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]]))
    assert (d.tokens, d.seqs, d.norm_len) == (5, 2, 3)


def test_per_token_loss_matches_token_mean_policy_loss():
    """The engine's per-token loss (algos' compute_token_loss) aggregated by token-mean = the padded policy_loss."""
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.algorithms import policy_loss
    from arl.trainer.token_loss import compute_token_loss

    torch.manual_seed(0)
    logp, prox, behav, adv = (torch.randn(1, 6) for _ in range(4))
    ref, _ = policy_loss(logp, prox, behav, adv, torch.ones(1, 6))
    seq = torch.zeros(6, dtype=torch.long)
    tok, _ = compute_token_loss(AlgorithmConfig(), logp[0], prox[0], behav[0], adv[0], seq)
    assert aggregate(tok, seq, "token-mean", Denominators(6, 1, 6)).item() == pytest.approx(
        ref.item(), rel=1e-6
    )


def test_reuse_equals_recompute_and_bypass_uses_rollout_logprobs(tiny_model_dir):
    batch = random_batch(seed=2)
    _, p_rec, m_rec = step_grads(
        tiny_model_dir, batch, proximal_mode="recompute", max_tokens_per_microbatch=40
    )
    _, p_reuse, m_reuse = step_grads(
        tiny_model_dir, batch, proximal_mode="reuse", max_tokens_per_microbatch=40
    )
    for name in p_rec:
        assert rel(p_reuse[name].detach(), p_rec[name].detach()) <= 1e-6, name
    assert m_reuse["behaviour_proximal_abs_diff"] == pytest.approx(
        m_rec["behaviour_proximal_abs_diff"], rel=1e-6
    )
    _, p_bypass, m_bypass = step_grads(tiny_model_dir, batch, proximal_mode="bypass")
    assert m_bypass["behaviour_proximal_abs_diff"] == 0.0
    # loglinear (AReaL): tokens sampled at the current version or the one before keep their behaviour
    # log probs (= bypass); tokens two versions back sit halfway between behaviour and current.
    for version in (0, 1):
        _, p_ll, m_ll = step_grads(tiny_model_dir, batch, version=version, proximal_mode="loglinear")
        assert m_ll["behaviour_proximal_abs_diff"] == 0.0
        for name in p_bypass:
            assert torch.equal(p_ll[name], p_bypass[name]), name
    _, _, m_half = step_grads(tiny_model_dir, batch, version=2, proximal_mode="loglinear")
    assert m_half["behaviour_proximal_abs_diff"] == pytest.approx(
        0.5 * m_rec["behaviour_proximal_abs_diff"], rel=1e-5
    )


def test_auto_reuses_in_a_one_update_step_and_recomputes_across_updates(tiny_model_dir):
    """The default proximal mode saves the no-grad pass only where that changes nothing."""
    batch = random_batch(seed=3)
    _, p_rec, m_rec = step_grads(tiny_model_dir, batch, proximal_mode="recompute")
    _, p_auto, m_auto = step_grads(tiny_model_dir, batch, proximal_mode="auto")
    assert (m_rec["proximal_reused"], m_auto["proximal_reused"]) == (0.0, 1.0)
    for name in p_rec:
        assert rel(p_auto[name].detach(), p_rec[name].detach()) <= 1e-6, name
    # Two updates: the second runs on moved weights, so auto recomputes, exactly as recompute does.
    half = batch.input_ids.shape[0] // 2
    _, p_rec2, m_rec2 = step_grads(tiny_model_dir, batch, proximal_mode="recompute", mini_batch_rows=half)
    _, p_auto2, m_auto2 = step_grads(tiny_model_dir, batch, proximal_mode="auto", mini_batch_rows=half)
    assert m_auto2["updates"] == 2.0 and m_auto2["proximal_reused"] == 0.0
    for name in p_rec2:
        assert torch.equal(p_auto2[name], p_rec2[name]), name
    assert m_auto2["behaviour_proximal_abs_diff"] == m_rec2["behaviour_proximal_abs_diff"]


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_gives_the_same_gradients(tiny_model_dir, mode):
    batch = random_batch(seed=3)
    g_none, _, _ = step_grads(tiny_model_dir, batch)
    g_ckpt, _, _ = step_grads(tiny_model_dir, batch, activation_checkpointing=mode)
    for name in g_none:
        assert rel(g_ckpt[name], g_none[name]) <= 1e-6, name


def test_bf16_mixed_precision_keeps_fp32_master_weights(tiny_model_dir):
    batch = random_batch(seed=4)
    grads, params, metrics = step_grads(tiny_model_dir, batch, mixed_precision="bf16")
    g_fp32, _, _ = step_grads(tiny_model_dir, batch, mixed_precision="none")
    assert all(p.dtype == torch.float32 for p in params.values())
    assert all(g.dtype == torch.float32 for g in grads.values())
    # bf16 compute: the same gradient to bf16 precision, not bit-equal
    total = torch.cat([g.flatten() for g in grads.values()])
    ref = torch.cat([g.flatten() for g in g_fp32.values()])
    assert 0 < rel(total, ref) < 0.1
    assert torch.isfinite(torch.tensor(metrics["loss"]))


def test_a_response_with_its_own_prompt_is_assembled_on_that_prompt():
    """A trajectory that rendered its own prompt carries it (Response.prompt_ids, queue schema 3)."""
    from arl.queue.types import Response, Sample

    own = Response(
        response_ids=[7, 8],
        response_mask=[1, 1],
        response_logprobs=[-1.0, -1.0],
        weight_versions=[0, 0],
        reward=1.0,
        prompt_ids=[4, 5, 6],
    )
    plain = Response(
        response_ids=[9], response_mask=[1], response_logprobs=[-1.0], weight_versions=[0], reward=0.0
    )
    batch = assemble_batch(
        [Sample(uid="u", prompt_ids=[1, 2], responses=[own, plain], start_version=0, end_version=0)], 0
    )
    assert batch.input_ids.tolist() == [[4, 5, 6, 7, 8], [1, 2, 9, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 0, 0]]
