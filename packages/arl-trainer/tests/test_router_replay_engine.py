"""Router replay inside the packed trainer step (`PackedPolicy`), on a tiny random Qwen3-MoE (fp32, CPU).

Forced routes (random experts, so replay visibly changes the forward) are laid out per segment row by
`routes_for_batch` and mapped onto the packed token order: the packed log probs equal a hand-run
padded Hugging Face forward under `replay_routes` with the same routes, the backward's recomputation
of checkpointed layers replays them too, the aux loss pools the micro-batch's tokens, and "off" trains
exactly as without routes while still measuring. Dense models are untouched.
"""

from __future__ import annotations

import pytest
import torch
from router_replay_helpers import (
    EXPERTS,
    LAYERS,
    TOP_K,
    VOCAB,
    replay_config,
    routed_samples,
    two_rank_replay,
)

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.algorithms import token_log_probs
from arl.trainer.config import OptimConfig
from arl.trainer.errors import RouterReplayError
from arl.trainer.router_replay import load_balancing_loss, replay_routes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():  # clear-cut router choices, so forced routes change the forward visibly
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 1.0)
    path = tmp_path_factory.mktemp("moe")
    model.save_pretrained(path)
    return path


def policy(model_dir, **cfg):
    cfg.setdefault("optim", OptimConfig(lr=1e-2, grad_clip=1e9))
    cfg.setdefault("max_tokens_per_microbatch", 40)  # several packed micro-batches
    return HFPolicy(model_dir, TrainerConfig(mixed_precision="none", **cfg))


def hand_log_probs(model_dir, batch, routes):
    """Row by row, the padded HF forward under `replay_routes` (or the model's own routing)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = torch.zeros(batch.loss_mask.shape)
    with torch.no_grad():
        for r, n in enumerate(batch.attention_mask.sum(-1).tolist()):
            ids = batch.input_ids[r : r + 1, :n]
            with replay_routes(model, None if routes is None else routes[r : r + 1, :n]):
                out[r, :n] = token_log_probs(model(input_ids=ids).logits, ids)[0]
    return out * batch.loss_mask


def test_packed_replay_equals_hand_forward_with_forced_routes(moe_dir):
    batch, routes = routed_samples()
    replayed = policy(moe_dir, router_replay="rollout").log_probs(batch, routes)
    own = policy(moe_dir).log_probs(batch)
    hand_replayed = hand_log_probs(moe_dir, batch, routes)
    hand_own = hand_log_probs(moe_dir, batch, None)
    assert torch.allclose(replayed, hand_replayed, atol=1e-5), (replayed - hand_replayed).abs().max()
    assert torch.allclose(own, hand_own, atol=1e-5)
    assert (replayed - own).abs().max() > 1e-3  # the forced routes really changed the forward
    # "off" only measures: the log probs are the model's own.
    assert torch.equal(policy(moe_dir).log_probs(batch, routes), own)


def test_train_step_replays_and_reports_route_metrics(moe_dir):
    batch, routes = routed_samples(seed=1)
    rows = batch.input_ids.shape[0]
    p = policy(moe_dir, router_replay="rollout", router_replay_gap_every=1)
    m = p.train_step(batch, mini_batch_rows=rows, routes=routes)
    # Every sampled token with a route is counted once (training forwards only, not proximal or gap).
    routed = int((routes[:, :, 0, 0] >= 0).sum())
    assert m["router_replay/routed_tokens"] == routed
    assert m["router_replay/route_diff_frac"] > 0.5  # random routes mostly differ from the router's own
    for layer in range(LAYERS):
        assert 0.0 < m[f"router_replay/route_diff_frac_layer{layer}"] <= 1.0
    # Gap = |trainer - behaviour| with replay off and on; the proximal (recompute) pass replays too.
    mask = batch.loss_mask.bool()
    for mode, hand_routes in (("on", routes), ("off", None)):
        gap = (hand_log_probs(moe_dir, batch, hand_routes) - batch.behaviour_logp)[mask].abs()
        assert m[f"router_replay/logp_gap_{mode}_mean"] == pytest.approx(gap.mean().item(), abs=2e-6)
        assert m[f"router_replay/logp_gap_{mode}_max"] == pytest.approx(gap.max().item(), abs=1e-5)
    assert abs(m["router_replay/logp_gap_on_mean"] - m["router_replay/logp_gap_off_mean"]) > 2e-5
    assert m["behaviour_proximal_abs_diff"] == pytest.approx(m["router_replay/logp_gap_on_mean"], abs=1e-5)


def test_off_trains_exactly_as_without_routes_and_still_measures(moe_dir):
    batch, routes = routed_samples(seed=2)
    rows = batch.input_ids.shape[0]
    a, b = policy(moe_dir), policy(moe_dir)
    ma = a.train_step(batch, mini_batch_rows=rows, routes=routes)
    mb = b.train_step(batch, mini_batch_rows=rows)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(pa, pb), name
    assert ma["loss"] == mb["loss"] and ma["router_replay/route_diff_frac"] > 0
    assert not any(k.startswith("router_replay/") for k in mb)


def test_checkpointed_backward_replays_the_same_routes(moe_dir):
    batch, routes = routed_samples(seed=3)
    rows = batch.input_ids.shape[0]
    plain, ckpt = (
        policy(moe_dir, router_replay="rollout"),
        policy(moe_dir, router_replay="rollout", activation_checkpointing="full"),
    )
    m1 = plain.train_step(batch, mini_batch_rows=rows, routes=routes)
    m2 = ckpt.train_step(batch, mini_batch_rows=rows, routes=routes)
    for (name, p1), p2 in zip(plain.model.named_parameters(), ckpt.model.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6), name
    assert m1["router_replay/routed_tokens"] == m2["router_replay/routed_tokens"]  # recomputation not counted
    assert m1["router_replay/route_diff_frac_per_layer"] == m2["router_replay/route_diff_frac_per_layer"]


def test_aux_loss_pools_the_minibatch_tokens_with_replayed_experts(moe_dir):
    from transformers import AutoModelForCausalLM

    batch, routes = routed_samples(seed=4)
    rows = batch.input_ids.shape[0]
    coef = 0.5
    with_aux = policy(
        moe_dir, router_replay="rollout", router_aux_loss_coef=coef, max_tokens_per_microbatch=4096
    )
    without = policy(moe_dir, router_replay="rollout", max_tokens_per_microbatch=4096)
    m = with_aux.train_step(batch, mini_batch_rows=rows, routes=routes)
    m0 = without.train_step(batch, mini_batch_rows=rows, routes=routes)
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    with torch.no_grad(), replay_routes(model, routes, keep_for_aux=True) as stats:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    expected = load_balancing_loss(stats, EXPERTS, token_mask=batch.attention_mask).item()
    assert m["router_replay/aux_loss"] == pytest.approx(expected, rel=1e-4)
    assert m["loss"] == pytest.approx(m0["loss"] + coef * expected, rel=1e-4)
    # Several micro-batches: each adds its own aux loss weighted by its share of the mini-batch's tokens.
    ms = policy(moe_dir, router_replay="rollout", router_aux_loss_coef=coef).train_step(
        batch, mini_batch_rows=rows, routes=routes
    )
    assert ms["microbatches"] > 1 and 0.0 < ms["router_replay/aux_loss"] < 2 * expected


def test_dense_model_is_untouched_and_misconfigurations_are_named(moe_dir, tiny_model_dir):
    batch, routes = routed_samples(seed=5)
    rows = batch.input_ids.shape[0]
    dense = policy(tiny_model_dir, algorithm=AlgorithmConfig())
    assert not any(k.startswith("router_replay/") for k in dense.train_step(batch, mini_batch_rows=rows))
    with pytest.raises(RouterReplayError, match="router_replay='rollout' needs an MoE model"):
        policy(tiny_model_dir, router_replay="rollout")
    with pytest.raises(RouterReplayError, match="router_aux_loss_coef"):
        policy(tiny_model_dir, router_aux_loss_coef=0.1)
    replay = policy(moe_dir, router_replay="rollout")
    with pytest.raises(RouterReplayError, match="return_routed_experts"):
        replay.train_step(batch, mini_batch_rows=rows)
    with pytest.raises(RouterReplayError, match="do not cover"):
        replay.train_step(batch, mini_batch_rows=rows, routes=routes[:, :-1])
    with pytest.raises(ValueError, match="router_replay_gap_every"):
        TrainerConfig(router_replay_gap_every=-1)


@pytest.mark.slow  # two spawned gloo ranks (~40 s of CPU)
def test_fsdp_two_ranks_replay_like_one_device(moe_dir, tmp_path):
    from arl.trainer.distributed import spawn_local

    spawn_local(two_rank_replay, 2, moe_dir, tmp_path, backend="gloo")
    two = torch.load(tmp_path / "replay_two_ranks.pt", weights_only=False)
    batch, routes = routed_samples(seed=6)
    single = HFPolicy(moe_dir, replay_config())
    m = single.train_step(batch, mini_batch_rows=batch.input_ids.shape[0], routes=routes)
    # Route counts and gap extremes are summed / maxed over ranks: the same as on one device.
    for key, value in m.items():
        if key.startswith("router_replay/") or key in ("loss", "behaviour_proximal_abs_diff"):
            assert two["m"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for name, p in single.model.named_parameters():
        assert torch.allclose(two["params"][name], p.detach(), atol=1e-5), name
