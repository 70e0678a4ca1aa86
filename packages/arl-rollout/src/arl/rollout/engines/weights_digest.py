"""Checking an engine's weights against the trainer's by fingerprints, without moving the weights.

`weights_check` compares tensors, which means carrying every engine tensor and every trainer tensor
to one process: fine for small models, 15 GB each way for a 7B one. Here each side fingerprints its
tensors where they live (on their GPUs) and only the fingerprints travel:

* The engine's worker digests every parameter (`engine_digests`): a few integers per tensor, and one
  row of them per row for the vocabulary tensors, whose padded rows must be left out of the sum.
* The trainer streams its parameters one at a time (under FSDP2 the same gather a sync does), rebuilds
  each engine tensor exactly as `weights_check` does (fused q/k/v and gate/up, TP shards, the engine's
  dtype) as soon as its pieces have arrived, digests it and drops the pieces (`compare_digests`).

The fingerprint of a tensor is exact integer arithmetic over its bits: per row, the sum of its 16-bit
words and two sums weighted by the word's column; over the rows, those sums weighted by the row's
position (see `row_digests`, `_total`). Every partial sum is an integer float64 holds exactly, so it
is identical on any device and in any reduction order; any changed bit changes it, and moved words
almost always do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import torch

from arl.rollout.engines.weights_check import _FUSED, _VOCAB, expected_engine_tensor

#: Weights of a word's column (two primes near 2^12) and of a row (two near 2^16), and the modulus
#: the row sums are combined under: a word (|w| < 2^16) times a column weight stays below 2^28, so a row
#: of up to 2^24 words sums exactly in float64 (< 2^53) — one matrix product per chunk, any order.
_COLUMN_PRIMES = (4093, 4091)
_ROW_PRIMES = (65521, 65519)
_MODULUS = (1 << 31) - 1
_MAX_WIDTH = 1 << 24
#: Words digested per chunk (bounds the float64 temporary to ~128 MB).
_CHUNK_WORDS = 1 << 24


class TensorDigest(msgspec.Struct, frozen=True, array_like=True):
    """One engine tensor's fingerprint: its shape, dtype and digest; `rows` holds one digest per
    row for vocabulary tensors (the checker sums the rows the trainer's vocabulary covers)."""

    shape: tuple[int, ...]
    dtype: str
    digest: tuple[int, int, int]
    rows: list[tuple[int, int, int]] | None = None


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as 16-bit words (bytes for 1-byte dtypes), one row per row of `t` (2-D,
    integer; converted to float64 chunk by chunk, exactly)."""
    t = t.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    rows = t.shape[0] if t.dim() > 1 else 1
    if t.numel() == 0:
        return torch.zeros(rows, 0, dtype=torch.int16, device=t.device)
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int16).reshape(rows, -1)


def _column_weights(width: int, device: torch.device) -> torch.Tensor:
    """(width, 3) float64: 1, (j mod 4093) + 1, (j mod 4091) + 1 for column j."""
    key = (width, device)
    if key not in _COLUMN_WEIGHTS:
        j = torch.arange(width, device=device, dtype=torch.int64)
        _COLUMN_WEIGHTS[key] = torch.stack(
            [torch.ones_like(j)] + [j % p + 1 for p in _COLUMN_PRIMES], dim=1
        ).double()
    return _COLUMN_WEIGHTS[key]


_COLUMN_WEIGHTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def row_digests(t: torch.Tensor) -> torch.Tensor:
    """(rows, 3) int64 on `t`'s device, per row of `t`: Σ word, Σ word·((j mod 4093) + 1) and
    Σ word·((j mod 4091) + 1) over the row's words (j: the word's column)."""
    words = _words(t)
    rows, width = words.shape
    if width > _MAX_WIDTH:
        raise ValueError(
            f"a tensor row of {width} 16-bit words is too wide for an exact digest (max {_MAX_WIDTH})"
        )
    out = torch.empty(rows, 3, dtype=torch.int64, device=words.device)
    weights = _column_weights(width, words.device)
    step = max(1, _CHUNK_WORDS // max(1, width))
    for r0 in range(0, rows, step):
        out[r0 : r0 + step] = (words[r0 : r0 + step].double() @ weights).long()
    return out


def _total(rows: torch.Tensor) -> tuple[int, int, int]:
    """The tensor's digest from its row digests: column 0 summed, columns 1 and 2 weighted by the
    row's position ((r mod 65521) + 1, (r mod 65519) + 1), all mod 2^31 − 1 (exact in int64)."""
    rows = rows % _MODULUS
    r = torch.arange(rows.shape[0], device=rows.device, dtype=torch.int64)
    sums = [rows[:, 0].sum()] + [
        (rows[:, k] * (r % p + 1) % _MODULUS).sum() for k, p in enumerate(_ROW_PRIMES, 1)
    ]
    return tuple(int(v) % _MODULUS for v in sums)  # type: ignore[return-value]


def tensor_digest(t: torch.Tensor, keep_rows: bool = False) -> TensorDigest:
    rows = row_digests(t)
    return TensorDigest(
        shape=tuple(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        digest=_total(rows),
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
    covered = _total(torch.tensor(info.rows[: expected.shape[0]], dtype=torch.int64).view(-1, 3))
    return "equal" if tensor_digest(expected).digest == covered else "mismatched"


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
    not by how much), plus `trainer_nonfinite`: the trainer tensors holding NaN or inf (the same for
    every replica). Bit-identical NaNs on both sides are "equal"; this says that they are NaN.
    """
    Key = tuple[int, int, str]  # (replica, TP rank, engine name)
    pending: dict[Key, TensorDigest] = {
        (i, r, n): d
        for i, ranks in enumerate(replicas)
        for r, rank in enumerate(ranks)
        for n, d in rank.items()
    }
    waiting_on: dict[str, set[Key]] = {}
    for key in pending:
        for source in _sources(key[2]):
            waiting_on.setdefault(source, set()).add(key)
    tied_head = any(name == "lm_head.weight" for _, _, name in pending)
    hf: dict[str, torch.Tensor] = {}
    results: list[dict[str, Any]] = [
        {"mismatched": [], "unmatched": [], "prepacked": [], "compared": 0} for _ in replicas
    ]

    def check(key: Key) -> None:
        replica, rank, name = key
        verdict = _check_one(name, pending.pop(key), hf, rank, len(replicas[replica]))
        result = results[replica]
        if verdict != "equal":
            result[verdict].append(f"rank{rank}:{name}")
        result["compared"] += verdict in ("equal", "mismatched")

    nonfinite: list[str] = []
    for name, tensor in trainer:
        hf[name] = tensor
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            nonfinite.append(name)
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
        result["equal"] = (
            not result["mismatched"] and not result["unmatched"] and engine_total > len(result["prepacked"])
        )
        result["trainer_nonfinite"] = list(nonfinite)
    return results
