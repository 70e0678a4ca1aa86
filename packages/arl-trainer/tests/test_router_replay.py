"""MoE routing replay on a tiny random Qwen3-MoE: the forward uses the given experts, gradients reach
the router, the stats count differing routes, and routes land at the positions that sampled tokens."""

from __future__ import annotations

import pytest
import torch

from arl.queue import Response, Sample
from arl.queue.routed_experts import pack_routes
from arl.trainer.errors import RouterReplayError
from arl.trainer.router_replay import find_routers, load_balancing_loss, replay_routes, routes_for_batch

torch.set_num_threads(1)
LAYERS, EXPERTS, TOP_K = 2, 8, 2


@pytest.fixture(scope="module")
def moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=64,
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
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # a livelier router than the 0.02-std init, so choices are clear-cut
        for router in find_routers(model).values():
            router.weight.normal_(0, 1.0)
    return model


def own_routes(model, ids):
    """The model's own top-k per (batch, token, layer), recorded through a measuring replay pass."""
    seen = {}
    hooks = [
        r.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out[2]))
        for i, r in find_routers(model).items()
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return torch.stack([seen[i] for i in range(LAYERS)], 1).reshape(*ids.shape, LAYERS, TOP_K)


def test_replaying_own_routes_changes_nothing_and_no_routes_is_noop(moe):
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        ref = moe(input_ids=ids).logits
        with replay_routes(moe, own_routes(moe, ids)) as stats:
            same = moe(input_ids=ids).logits
        with replay_routes(moe, None):
            noop = moe(input_ids=ids).logits
    assert torch.equal(ref, noop)
    assert torch.allclose(ref, same, atol=1e-6)
    assert stats.summary()["router_replay/route_diff_frac"] == 0.0
    assert stats.summary()["router_replay/routed_tokens"] == 14


def test_block_output_is_the_replayed_experts_mix(moe):
    block = moe.model.layers[1].mlp
    h = torch.randn(5, 32)
    routes = torch.full((1, 5, LAYERS, TOP_K), -1)
    forced = torch.tensor([[0, 7], [3, 1], [5, 6], [2, 4], [7, 0]])
    routes[0, :4, 1] = forced[:4]  # token 4 keeps its own routing
    with torch.no_grad(), replay_routes(moe, routes):
        out = block(h[None])[0]
    experts, gate = block.experts, block.gate
    probs = torch.softmax(h @ gate.weight.T, -1)
    for t in range(5):
        chosen = forced[t] if t < 4 else probs[t].topk(TOP_K).indices
        w = probs[t, chosen] / probs[t, chosen].sum()
        expected = torch.zeros(32)
        for e, we in zip(chosen.tolist(), w):
            g, u = (experts.gate_up_proj[e] @ h[t]).chunk(2)
            expected += we * (experts.down_proj[e] @ (torch.nn.functional.silu(g) * u))
        assert torch.allclose(out[t], expected, atol=1e-5), t


def test_router_still_gets_gradients_and_stats_count_flips(moe):
    ids = torch.randint(0, 64, (1, 6))
    routes = own_routes(moe, ids).clone()
    routes[0, 2, 0] = torch.tensor([r for r in range(EXPERTS) if r not in routes[0, 2, 0].tolist()][:TOP_K])
    routes[0, 5] = -1  # not a sampled token's step: the model routes it
    moe.zero_grad()
    with replay_routes(moe, routes, keep_for_aux=True) as stats:
        out = moe(input_ids=ids, output_router_logits=True)
    (out.logits.logsumexp(-1).sum() + load_balancing_loss(stats, EXPERTS)).backward()
    for router in find_routers(moe).values():
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    s = stats.summary()
    assert s["router_replay/routed_tokens"] == 5 and s["router_replay/route_diff_frac"] == pytest.approx(
        1 / 5
    )
    assert s["router_replay/route_diff_frac_per_layer"] == pytest.approx(1 / 10)


def test_aux_loss_matches_transformers_when_routes_are_own(moe):
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad(), replay_routes(moe, own_routes(moe, ids), keep_for_aux=True) as stats:
        out = moe(input_ids=ids, output_router_logits=True)
    assert torch.allclose(load_balancing_loss(stats, EXPERTS), out.aux_loss, atol=1e-6)


def test_measure_only_mode_leaves_the_forward_alone(moe):
    ids = torch.randint(0, 64, (1, 6))
    routes = (own_routes(moe, ids) + 1) % EXPERTS  # every choice differs
    with torch.no_grad():
        ref = moe(input_ids=ids).logits
        with replay_routes(moe, routes, apply=False) as stats:
            measured = moe(input_ids=ids).logits
        with replay_routes(moe, routes):
            replayed = moe(input_ids=ids).logits
    assert torch.equal(ref, measured) and not torch.allclose(ref, replayed)
    assert stats.summary()["router_replay/route_diff_frac"] == 1.0


def test_routes_for_batch_places_each_route_at_the_step_that_sampled_it():
    rows = [[[t, t + 1], [t + 2, t + 3]] for t in range(4)]
    rows[2] = []  # a tool-output token
    resp = Response(
        response_ids=[9, 9, 9, 9],
        response_mask=[1, 1, 0, 1],
        response_logprobs=[0.0] * 4,
        weight_versions=[0] * 4,
        reward=0.0,
        routed_experts=pack_routes(rows),
    )
    dense = Response(
        response_ids=[9], response_mask=[1], response_logprobs=[0.0], weight_versions=[0], reward=0.0
    )
    s = Sample(uid="u", prompt_ids=[1, 2, 3], responses=[resp, dense], start_version=0, end_version=0)
    out = routes_for_batch([s], width=8)
    assert out.shape == (2, 8, 2, 2)
    assert out[0, 2].tolist() == rows[0] and out[0, 3].tolist() == rows[1] and out[0, 5].tolist() == rows[3]
    assert (
        (out[0, 4] == -1).all()
        and (out[0, :2] == -1).all()
        and (out[0, 6:] == -1).all()
        and (out[1] == -1).all()
    )
    assert (
        routes_for_batch([Sample(uid="d", prompt_ids=[1], responses=[dense], start_version=0, end_version=0)])
        is None
    )
    with pytest.raises(RouterReplayError, match="width"):
        routes_for_batch([s], width=5)


def test_bad_routes_are_named(moe):
    ids = torch.randint(0, 64, (1, 4))
    with pytest.raises(RouterReplayError, match="experts"):
        with replay_routes(moe, torch.full((1, 4, LAYERS, TOP_K), EXPERTS)):
            pass
    with pytest.raises(RouterReplayError, match="tokens"), torch.no_grad():
        with replay_routes(moe, torch.zeros((1, 3, LAYERS, TOP_K), dtype=torch.long)):
            moe(input_ids=ids)
    with pytest.raises(RouterReplayError, match="no MoE router"):
        with replay_routes(torch.nn.Linear(2, 2), torch.zeros((1, 1, 1, 1), dtype=torch.long)):
            pass
