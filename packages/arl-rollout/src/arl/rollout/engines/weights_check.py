"""Checks that an inference engine holds exactly the trainer's weights after a sync.

The expected engine tensor is rebuilt from the trainer's Hugging Face tensors the way vLLM's loaders
build it: q/k/v fused into `qkv_proj` and gate/up into `gate_up_proj`, `lm_head` tied to the
embeddings, cast to the engine's dtype (the sync casts the same way, so a bf16 engine is compared bit
for bit with the trainer's fp32 master weights rounded to bf16), and, with tensor parallelism, cut to
the rank's shard: column-parallel layers (each part of qkv / gate_up) by output rows, row-parallel
ones (o_proj, down_proj) by input columns, KV heads replicated when there are fewer than TP ranks,
vocabulary-parallel embeddings by padded vocabulary rows (padding rows are not compared).

vLLM's CPU build moves linear weights into prepacked kernels and leaves an empty parameter behind:
those are reported as `prepacked` and must be checked through the engine's outputs instead (the app
compares the engine's log probs with the trainer's on a probe sequence).
"""

from __future__ import annotations

import torch

_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_VOCAB = ("embed_tokens", "lm_head")


def _column_shard(full: torch.Tensor, rows: int, rank: int, tp: int) -> torch.Tensor | None:
    """Rank `rank`'s `rows` output rows of a column-parallel part (evenly split, or one replicated
    KV head when there are fewer heads than ranks)."""
    total = full.shape[0]
    if rows * tp == total:
        return full[rank * rows : (rank + 1) * rows]
    if rows < total and total % rows == 0 and tp % (total // rows) == 0:
        heads = total // rows  # KV heads < TP: each head is replicated over tp // heads ranks
        head = rank // (tp // heads)
        return full[head * rows : (head + 1) * rows]
    if rows == total:
        return full
    return None


def _fused_expected(
    name: str, fused: str, engine_rows: int, hf: dict[str, torch.Tensor], rank: int, tp: int
) -> torch.Tensor | None:
    pieces = [hf.get(name.replace(fused, p)) for p in _FUSED[fused]]
    if any(p is None for p in pieces):
        return None
    if tp == 1:
        return torch.cat(pieces, dim=0)  # type: ignore[arg-type]
    if fused == "gate_up_proj":
        rows = [p.shape[0] // tp for p in pieces]  # type: ignore[union-attr]
    else:  # q split evenly; k and v share the rest of the shard's rows
        q_rows = pieces[0].shape[0] // tp  # type: ignore[union-attr]
        kv_rows = (engine_rows - q_rows) // 2
        rows = [q_rows, kv_rows, kv_rows]
    shards = [_column_shard(p, r, rank, tp) for p, r in zip(pieces, rows, strict=True)]  # type: ignore[arg-type]
    if any(s is None for s in shards):
        return None
    return torch.cat(shards, dim=0)  # type: ignore[arg-type]


def _shard(expected: torch.Tensor, shape: torch.Size, name: str, rank: int, tp: int) -> torch.Tensor | None:
    """The rank's part of a full tensor, given the engine tensor's shape (None: no layout fits)."""
    if expected.shape == shape:
        return expected
    if expected.dim() != len(shape):
        return None
    if any(part in name for part in _VOCAB) and expected.dim() == 2 and expected.shape[1] == shape[1]:
        rows = shape[0]  # vocab padded to a multiple, then split: rank r holds padded rows [r*rows, +rows)
        lo = rank * rows
        hi = min(lo + rows, expected.shape[0])
        if lo >= expected.shape[0]:
            return expected[:0]
        return expected[lo:hi]
    differing = [d for d in range(expected.dim()) if expected.shape[d] != shape[d]]
    if len(differing) == 1 and shape[differing[0]] * tp == expected.shape[differing[0]]:
        d = differing[0]
        size = shape[d]
        return expected.narrow(d, rank * size, size)
    return None


def expected_engine_tensor(
    name: str,
    hf: dict[str, torch.Tensor],
    shape: torch.Size | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
) -> torch.Tensor | None:
    """The engine tensor `name` (of `shape`, on TP rank `tp_rank` of `tp_size`) rebuilt from `hf`."""
    full: torch.Tensor | None = None
    if name in hf:
        full = hf[name]
    else:
        for fused in _FUSED:
            if f".{fused}." in name:
                rows = shape[0] if shape is not None else 0
                return _fused_expected(name, fused, rows, hf, tp_rank, tp_size)
        if name == "lm_head.weight":
            full = hf.get("model.embed_tokens.weight")
    if full is None or shape is None or tp_size == 1 and full.shape == shape:
        return full
    return _shard(full, shape, name, tp_rank, tp_size)


def compare_weights(
    trainer: dict[str, torch.Tensor], engine: dict[str, torch.Tensor], tp_rank: int = 0, tp_size: int = 1
) -> dict[str, object]:
    """Max abs difference over every engine tensor of one TP rank, and the names that differ or are
    unknown. Expected tensors are cast to the engine tensor's dtype before comparing."""
    max_diff = 0.0
    mismatched: list[str] = []
    unmatched: list[str] = []
    prepacked: list[str] = []
    for name, tensor in engine.items():
        if tensor.numel() == 0:
            full = expected_engine_tensor(name, trainer)
            if full is not None and full.numel() > 0:
                prepacked.append(name)
                continue
        expected = expected_engine_tensor(name, trainer, tensor.shape, tp_rank, tp_size)
        if expected is None:
            unmatched.append(name)
            continue
        actual = tensor[: expected.shape[0]] if expected.shape != tensor.shape and expected.dim() else tensor
        if expected.shape != actual.shape:
            unmatched.append(name)
            continue
        expected = expected.to(actual.dtype)
        diff = (expected.float() - actual.float()).abs().max().item() if actual.numel() else 0.0
        max_diff = max(max_diff, diff)
        if diff > 0:
            mismatched.append(name)
    return {
        "equal": not mismatched and not unmatched and len(engine) > len(prepacked),
        "max_abs_diff": max_diff,
        "mismatched": mismatched,
        "unmatched": unmatched,
        "prepacked": prepacked,
        "compared": len(engine) - len(unmatched) - len(prepacked),
    }


def compare_weights_tp(
    trainer: dict[str, torch.Tensor], ranks: list[dict[str, torch.Tensor]]
) -> dict[str, object]:
    """`compare_weights` over every TP rank of one replica (rank i's tensors are `ranks[i]`)."""
    results = [compare_weights(trainer, engine, i, len(ranks)) for i, engine in enumerate(ranks)]
    return {
        "equal": all(r["equal"] for r in results),
        "max_abs_diff": max(float(r["max_abs_diff"]) for r in results),  # type: ignore[arg-type]
        "mismatched": [f"rank{i}:{n}" for i, r in enumerate(results) for n in r["mismatched"]],  # type: ignore[attr-defined]
        "unmatched": [f"rank{i}:{n}" for i, r in enumerate(results) for n in r["unmatched"]],  # type: ignore[attr-defined]
        "prepacked": [f"rank{i}:{n}" for i, r in enumerate(results) for n in r["prepacked"]],  # type: ignore[attr-defined]
        "compared": sum(int(r["compared"]) for r in results),  # type: ignore[call-overload]
    }
