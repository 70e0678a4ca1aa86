"""Checking an engine's weights against the trainer's by fingerprints, without moving the weights.

`weights_check` compares tensors, which means carrying every engine tensor and every trainer tensor
to one process: fine for small models, 15 GB each way for a 7B one. Here each side fingerprints its
tensors where they live (on their GPUs) and only the fingerprints travel:

* The engine's worker digests every parameter (`engine_digests`): a few integers per tensor, and one
  row of them per row for the vocabulary tensors, whose padded rows must be left out of the sum.
* The trainer streams its parameters one at a time (under FSDP2 the same gather a sync does), rebuilds
  each engine tensor exactly as `weights_check` does (fused q/k/v and gate/up, TP shards, the engine's
  dtype) as soon as its pieces have arrived, digests it and drops the pieces (`compare_digests`).

The fingerprint of a tensor is exact integer arithmetic over its bits — the sum of its 16-bit words
and two sums weighted by the word's position (mod 4093 and mod 4091) — so it is identical on any
device and in any reduction order, any changed bit changes it, and moved words almost always do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import torch

from arl.rollout.engines.weights_check import _FUSED, _VOCAB, expected_engine_tensor

#: Position weights: two primes near 2^12 (products of a 16-bit word and a weight fit int32).
_PRIMES = (4093, 4091)
#: Words digested per chunk (bounds the temporary int32/int64 buffers: ~16M words, 200 MB).
_CHUNK_WORDS = 1 << 24


class TensorDigest(msgspec.Struct, frozen=True, array_like=True):
    """One engine tensor's fingerprint: its shape, dtype and digest; `rows` holds one digest per
    row for vocabulary tensors (the checker sums the rows the trainer's vocabulary covers)."""

    shape: tuple[int, ...]
    dtype: str
    digest: tuple[int, int, int]
    rows: list[tuple[int, int, int]] | None = None


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as non-negative integers, one row per row of `t` (int32, 2-D)."""
    t = t.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    rows = t.shape[0] if t.dim() > 1 else 1
    if t.numel() == 0:
        return torch.zeros(rows, 0, dtype=torch.int32, device=t.device)
    if t.element_size() == 1:
        return t.view(torch.uint8).reshape(rows, -1).to(torch.int32)
    return (t.view(torch.int16).reshape(rows, -1).to(torch.int32) & 0xFFFF)


def row_digests(t: torch.Tensor) -> torch.Tensor:
    """(rows, 3) int64 on `t`'s device: per row of `t`, Σ word, Σ word·w₁(i), Σ word·w₂(i) over the
    row's words, i being the word's position in the whole tensor."""
    words = _words(t)
    rows, width = words.shape
    out = torch.empty(rows, 3, dtype=torch.int64, device=words.device)
    step = max(1, _CHUNK_WORDS // max(1, width))
    for r0 in range(0, rows, step):
        chunk = words[r0 : r0 + step]
        position = torch.arange(r0 * width, (r0 + chunk.shape[0]) * width, device=words.device,
                                dtype=torch.int64).view(chunk.shape)
        out[r0 : r0 + chunk.shape[0], 0] = chunk.sum(dim=1, dtype=torch.int64)
        for k, prime in enumerate(_PRIMES, start=1):
            weight = (position % prime + 1).to(torch.int32)
            out[r0 : r0 + chunk.shape[0], k] = (chunk * weight).sum(dim=1, dtype=torch.int64)
    return out


def _total(rows: torch.Tensor) -> tuple[int, int, int]:
    """Exact column sums (Python integers: no int64 overflow for any tensor size)."""
    sums = [0, 0, 0]
    for start in range(0, rows.shape[0], 4096):
        for k, v in enumerate(rows[start : start + 4096].sum(dim=0).tolist()):
            sums[k] += int(v)
    return sums[0], sums[1], sums[2]


def tensor_digest(t: torch.Tensor, keep_rows: bool = False) -> TensorDigest:
    rows = row_digests(t)
    return TensorDigest(
        shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."), digest=_total(rows),
        rows=[tuple(r) for r in rows.tolist()] if keep_rows else None,  # type: ignore[misc]
    )


def engine_digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, TensorDigest]:
    """Every engine parameter's fingerprint (vocabulary tensors keep their per-row digests)."""
    return {name: tensor_digest(t, keep_rows=any(part in name for part in _VOCAB)) for name, t in named}


def _sources(name: str) -> tuple[str, ...]:
    """The trainer tensors engine tensor `name` is built from (a tied lm_head is resolved at the end)."""
    for fused, parts in _FUSED.items():
        if f".{fused}." in name:
            return tuple(name.replace(fused, p) for p in parts)
    return (name,)


def _check_one(name: str, info: TensorDigest, hf: dict[str, torch.Tensor], rank: int, tp: int) -> str:
    """'equal' | 'mismatched' | 'unmatched' | 'prepacked' for one engine tensor."""
    if 0 in info.shape:
        full = expected_engine_tensor(name, hf)
        return "prepacked" if full is not None and full.numel() > 0 else "unmatched"
    expected = expected_engine_tensor(name, hf, torch.Size(info.shape), rank, tp)
    if expected is None:
        return "unmatched"
    expected = expected.to(getattr(torch, info.dtype))
    if tuple(expected.shape) == info.shape:
        return "equal" if tensor_digest(expected).digest == info.digest else "mismatched"
    # A vocabulary shard with padding rows: compare the rows the trainer's vocabulary covers.
    if info.rows is None or expected.dim() != len(info.shape) or tuple(expected.shape[1:]) != info.shape[1:]:
        return "unmatched"
    covered = [sum(r[k] for r in info.rows[: expected.shape[0]]) for k in range(3)]
    return "equal" if tensor_digest(expected).digest == tuple(covered) else "mismatched"


def compare_digests(
    trainer: Iterable[tuple[str, torch.Tensor]], ranks: list[dict[str, TensorDigest]]
) -> dict[str, Any]:
    """Check one replica (its TP ranks' digests) against the trainer's stream of (HF name, tensor)."""
    return compare_digests_replicas(trainer, [ranks])[0]


def compare_digests_replicas(
    trainer: Iterable[tuple[str, torch.Tensor]], replicas: list[list[dict[str, TensorDigest]]]
) -> list[dict[str, Any]]:
    """Check every replica (each a list of its TP ranks' digests) against one pass of the trainer's
    stream of (HF name, tensor) — under FSDP2 each item is a gather, so the stream is read once.

    A trainer tensor is kept only until every engine tensor built from it is checked (the embeddings
    until the end when a tied lm_head needs them). Each result has the shape of
    `weights_check.compare_weights_tp`'s, without `max_abs_diff` (digests say which tensors differ,
    not by how much).
    """
    Key = tuple[int, int, str]  # (replica, TP rank, engine name)
    pending: dict[Key, TensorDigest] = {
        (i, r, n): d for i, ranks in enumerate(replicas) for r, rank in enumerate(ranks) for n, d in rank.items()}
    waiting_on: dict[str, set[Key]] = {}
    for key in pending:
        for source in _sources(key[2]):
            waiting_on.setdefault(source, set()).add(key)
    tied_head = any(name == "lm_head.weight" for _, _, name in pending)
    hf: dict[str, torch.Tensor] = {}
    results: list[dict[str, Any]] = [
        {"mismatched": [], "unmatched": [], "prepacked": [], "compared": 0} for _ in replicas]

    def check(key: Key) -> None:
        replica, rank, name = key
        verdict = _check_one(name, pending.pop(key), hf, rank, len(replicas[replica]))
        result = results[replica]
        if verdict != "equal":
            result[verdict].append(f"rank{rank}:{name}")
        result["compared"] += verdict in ("equal", "mismatched")

    for name, tensor in trainer:
        hf[name] = tensor
        for key in sorted(waiting_on.get(name, ())):
            if key in pending and all(s in hf for s in _sources(key[2])):
                check(key)
        # Drop what no unchecked engine tensor is built from.
        for held in [h for h in hf if not any(k in pending for k in waiting_on.get(h, ()))]:
            if not (tied_head and held == "model.embed_tokens.weight"):
                del hf[held]
    for key in sorted(pending):  # the tied lm_head, and names no trainer tensor builds
        check(key)
    for ranks, result in zip(replicas, results, strict=True):
        engine_total = sum(len(rank) for rank in ranks)
        result["equal"] = not result["mismatched"] and not result["unmatched"] and engine_total > len(result["prepacked"])
    return results
