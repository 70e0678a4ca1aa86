"""Aggregating per-token losses into the scalar that is back-propagated, across micro-batches and ranks.

Losses arrive flat over loss tokens with the index of the sequence each belongs to; a sequence is
never split across micro-batches (packing keeps sequences whole). Every micro-batch divides by
denominators of the WHOLE mini-batch (all micro-batches, all ranks), so summing the micro-batch
gradients (gradient accumulation; ranks sum, not average, see `backward_scale`) gives exactly the
gradient of one big batch.

Modes (names as in verl):
- token-mean: Σ_tokens loss / (tokens in the mini-batch)
- seq-mean-token-mean: Σ_seq mean_{t∈seq} loss / (sequences in the mini-batch)
- seq-mean-token-sum-norm: Σ_tokens loss / (sequences × norm_len)  (Dr. GRPO; norm_len a constant, by
  default the longest response's loss-token count in the mini-batch)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class Denominators:
    """Counts over the whole mini-batch (every micro-batch on every rank)."""

    tokens: int
    seqs: int
    norm_len: int

    @staticmethod
    def from_loss_mask(loss_mask: torch.Tensor, norm_len: int | None = None) -> Denominators:
        """From a (B, T) loss mask of the whole mini-batch; rows without loss tokens are not counted."""
        per_row = loss_mask.sum(-1)
        return Denominators(
            tokens=max(1, int(per_row.sum().item())),
            seqs=max(1, int((per_row > 0).sum().item())),
            norm_len=norm_len
            if norm_len is not None
            else max(1, int(per_row.max().item()) if per_row.numel() else 1),
        )


def aggregate(
    token_loss: torch.Tensor, seq_index: torch.Tensor, mode: str, denom: Denominators
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss. token_loss (N,), seq_index (N,) long (local ids)."""
    if mode == "token-mean":
        return token_loss.sum() / denom.tokens
    if mode == "seq-mean-token-mean":
        if token_loss.numel() == 0:
            return token_loss.sum()
        counts = torch.bincount(seq_index)
        per_seq = torch.zeros(counts.shape[0], dtype=token_loss.dtype, device=token_loss.device)
        per_seq = per_seq.index_add(0, seq_index, token_loss)
        present = counts > 0
        return (per_seq[present] / counts[present].to(token_loss.dtype)).sum() / denom.seqs
    if mode == "seq-mean-token-sum-norm":
        return token_loss.sum() / (denom.seqs * denom.norm_len)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {MODES}")
