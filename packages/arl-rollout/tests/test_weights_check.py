"""weights_check against engine tensors laid out as vLLM lays them out: fused q/k/v and gate/up,
tensor-parallel shards (KV heads split or replicated), padded vocabulary shards, bf16 casts.

The engine side is built here from vLLM's sharding rules (heads per rank), independently of the
module under test."""

import pytest
import torch

from arl.rollout.engines.weights_check import compare_weights, compare_weights_tp

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, PAD = 8, 4, 2, 4, 12, 10, 64


def trainer_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    p = "model.layers.0."
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        p + "self_attn.q_norm.weight": (HEAD_DIM,),
        p + "mlp.gate_proj.weight": (INTER, HIDDEN),
        p + "mlp.up_proj.weight": (INTER, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTER),
        p + "input_layernorm.weight": (HIDDEN,),
        "model.norm.weight": (HIDDEN,),
    }
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


def heads(t: torch.Tensor, first: int, count: int) -> torch.Tensor:
    return t[first * HEAD_DIM : (first + count) * HEAD_DIM]


def vllm_rank(
    hf: dict[str, torch.Tensor], rank: int, tp: int, dtype=torch.float32
) -> dict[str, torch.Tensor]:
    """Rank `rank`'s parameters as vLLM names and shards them (Qwen3, tied embeddings)."""
    p = "model.layers.0."
    q_per = HEADS // tp
    if KV_HEADS >= tp:
        kv_first, kv_per = rank * (KV_HEADS // tp), KV_HEADS // tp
    else:  # fewer KV heads than ranks: each head is replicated over tp // KV_HEADS ranks
        kv_first, kv_per = rank // (tp // KV_HEADS), 1
    inter = INTER // tp
    vocab_rows = PAD // tp
    emb = torch.zeros(PAD, HIDDEN)
    emb[:VOCAB] = hf["model.embed_tokens.weight"]
    out = {
        "model.embed_tokens.weight": emb[rank * vocab_rows : (rank + 1) * vocab_rows],
        p + "self_attn.qkv_proj.weight": torch.cat(
            [
                heads(hf[p + "self_attn.q_proj.weight"], rank * q_per, q_per),
                heads(hf[p + "self_attn.k_proj.weight"], kv_first, kv_per),
                heads(hf[p + "self_attn.v_proj.weight"], kv_first, kv_per),
            ]
        ),
        p + "self_attn.o_proj.weight": hf[p + "self_attn.o_proj.weight"][:, rank * q_per * HEAD_DIM :][
            :, : q_per * HEAD_DIM
        ],
        p + "self_attn.q_norm.weight": hf[p + "self_attn.q_norm.weight"],
        p + "mlp.gate_up_proj.weight": torch.cat(
            [
                hf[p + "mlp.gate_proj.weight"][rank * inter : (rank + 1) * inter],
                hf[p + "mlp.up_proj.weight"][rank * inter : (rank + 1) * inter],
            ]
        ),
        p + "mlp.down_proj.weight": hf[p + "mlp.down_proj.weight"][:, rank * inter : (rank + 1) * inter],
        p + "input_layernorm.weight": hf[p + "input_layernorm.weight"],
        "model.norm.weight": hf["model.norm.weight"],
    }
    return {n: t.to(dtype).clone() for n, t in out.items()}


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_and_sharded_engine_tensors_match(tp, dtype):
    hf = trainer_tensors()
    ranks = [vllm_rank(hf, r, tp, dtype) for r in range(tp)]
    result = compare_weights_tp(hf, ranks)
    assert result["equal"], result
    assert result["max_abs_diff"] == 0.0
    assert result["compared"] == sum(len(r) for r in ranks)


def test_a_changed_element_in_one_shard_is_named():
    hf = trainer_tensors()
    ranks = [vllm_rank(hf, r, 2) for r in range(2)]
    ranks[1]["model.layers.0.self_attn.qkv_proj.weight"][-1, 0] += 1e-3  # a v row of rank 1
    result = compare_weights_tp(hf, ranks)
    assert not result["equal"]
    assert result["mismatched"] == ["rank1:model.layers.0.self_attn.qkv_proj.weight"]
    assert result["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)


def test_swapped_ranks_do_not_pass():
    hf = trainer_tensors()
    ranks = [vllm_rank(hf, r, 2) for r in range(2)]
    result = compare_weights_tp(hf, ranks[::-1])
    assert not result["equal"] and result["max_abs_diff"] > 0


def test_unknown_names_and_prepacked_tensors_are_reported():
    hf = trainer_tensors()
    engine = vllm_rank(hf, 0, 1)
    engine["model.layers.0.mlp.gate_up_proj.weight"] = torch.empty(0)  # vLLM CPU prepacked it
    engine["model.layers.0.mystery.weight"] = torch.zeros(3)
    result = compare_weights(hf, engine)
    assert result["prepacked"] == ["model.layers.0.mlp.gate_up_proj.weight"]
    assert result["unmatched"] == ["model.layers.0.mystery.weight"]
    assert not result["equal"]


def test_tied_lm_head_is_compared_with_the_embeddings():
    hf = trainer_tensors()
    engine = vllm_rank(hf, 0, 1)
    engine["lm_head.weight"] = engine["model.embed_tokens.weight"].clone()
    assert compare_weights(hf, engine)["equal"]


# ---- the same checks by fingerprints (weights_digest): only digests leave each side ----
from arl.rollout.engines.weights_digest import compare_digests, engine_digests, tensor_digest  # noqa: E402


def digests(ranks):
    return [engine_digests(r.items()) for r in ranks]


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_digests_of_fused_sharded_padded_engine_tensors_match(tp, dtype):
    hf = trainer_tensors()
    ranks = [vllm_rank(hf, r, tp, dtype) for r in range(tp)]
    for r, rank in enumerate(ranks):  # padding rows hold whatever the engine left there
        rows = rank["model.embed_tokens.weight"]
        real = max(0, min(rows.shape[0], VOCAB - r * rows.shape[0]))
        rows[real:] = torch.randn(rows.shape[0] - real, HIDDEN).to(dtype)
    result = compare_digests(iter(hf.items()), digests(ranks))
    assert result["equal"], result
    assert result["compared"] == sum(len(r) for r in ranks)


def test_digest_names_a_changed_element_and_swapped_ranks():
    hf = trainer_tensors()
    ranks = [vllm_rank(hf, r, 2) for r in range(2)]
    ranks[1]["model.layers.0.self_attn.qkv_proj.weight"][-1, 0] += 1e-3
    ranks[0]["model.embed_tokens.weight"][VOCAB // 2 - 1, 3] += 1e-3  # a real vocabulary row
    result = compare_digests(iter(hf.items()), digests(ranks))
    assert not result["equal"]
    assert sorted(result["mismatched"]) == [
        "rank0:model.embed_tokens.weight",
        "rank1:model.layers.0.self_attn.qkv_proj.weight",
    ]
    swapped = [vllm_rank(hf, r, 2) for r in (1, 0)]
    assert not compare_digests(iter(hf.items()), digests(swapped))["equal"]


def test_nan_weights_on_both_sides_are_equal_and_named_as_nonfinite():
    """A run whose trainer stepped on a NaN gradient sends NaN weights to the engine: bit for bit the
    same, so "equal", and the check names them."""
    hf = trainer_tensors()
    assert compare_digests(iter(hf.items()), digests([vllm_rank(hf, 0, 1)]))["trainer_nonfinite"] == []
    hf["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
    hf["model.norm.weight"][1] = float("inf")
    result = compare_digests(iter(hf.items()), digests([vllm_rank(hf, 0, 1)]))
    assert result["equal"], result
    assert result["trainer_nonfinite"] == ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]


def test_digest_reports_unknown_prepacked_and_checks_a_tied_lm_head():
    hf = trainer_tensors()
    engine = vllm_rank(hf, 0, 1)
    engine["model.layers.0.mlp.gate_up_proj.weight"] = torch.empty(0)
    engine["model.layers.0.mystery.weight"] = torch.zeros(3)
    engine["lm_head.weight"] = engine["model.embed_tokens.weight"].clone()
    result = compare_digests(iter(hf.items()), digests([engine]))
    assert result["prepacked"] == ["rank0:model.layers.0.mlp.gate_up_proj.weight"]
    assert result["unmatched"] == ["rank0:model.layers.0.mystery.weight"]
    assert result["mismatched"] == [] and not result["equal"]
    engine = vllm_rank(hf, 0, 1)
    engine["lm_head.weight"] = engine["model.embed_tokens.weight"].clone()
    engine["lm_head.weight"][0, 0] += 1.0
    assert compare_digests(iter(hf.items()), digests([engine]))["mismatched"] == ["rank0:lm_head.weight"]


def test_a_digest_sees_every_bit_and_every_move():
    g = torch.Generator().manual_seed(1)
    t = torch.randn(64, 48, generator=g).to(torch.bfloat16)
    base = tensor_digest(t).digest
    assert tensor_digest(t.t().contiguous().t()).digest == base  # layout in memory does not matter
    flipped = t.clone()
    flipped.view(torch.int16)[5, 7] ^= 1  # the lowest bit of one element
    swapped = t.clone()
    swapped[[0, 63]] = swapped[[63, 0]]  # two rows exchanged
    assert tensor_digest(flipped).digest != base and tensor_digest(swapped).digest != base
    for dtype in (torch.float32, torch.float16, torch.int8, torch.bool):
        assert (
            tensor_digest(torch.ones(3, 5, dtype=dtype)).digest
            != tensor_digest(torch.zeros(3, 5, dtype=dtype)).digest
        )


def test_the_trainer_stream_is_read_once_and_released_as_it_goes():
    """Only the pieces of engine tensors not yet complete are held (the embeddings for a tied head)."""
    import weakref

    hf = trainer_tensors()
    engine = vllm_rank(hf, 0, 1)
    engine["lm_head.weight"] = engine["model.embed_tokens.weight"].clone()
    alive: dict[str, weakref.ref] = {}
    most = 0

    def stream():
        nonlocal most
        for name, t in hf.items():
            copy = t.clone()
            alive[name] = weakref.ref(copy)
            most = max(most, sum(r() is not None for r in alive.values()))
            yield name, copy
            del copy

    assert compare_digests(stream(), digests([engine]))["equal"]
    # q, k, v of the layer wait for each other; the embeddings wait for the tied lm_head.
    assert most <= 4
