"""Per-sequence reductions over flat token tensors (the packed layout the losses use).

A micro-batch's loss tokens are one flat tensor (N,) and `seq_index` (N,) says which local sequence
(0..S-1) each token belongs to. These helpers reduce over sequences with `index_add` (no Python
loops, no host syncs when `num_seqs` is given) and broadcast sequence values back to tokens.
"""

from __future__ import annotations

import torch

from arl.trainer.errors import AlgorithmError


def check_flat(seq_index: torch.Tensor, *tensors: tuple[str, torch.Tensor | None]) -> int:
    """Validate the flat layout: every named tensor is 1-D with the length of `seq_index`. Returns N."""
    if seq_index.dim() != 1:
        raise AlgorithmError(f"seq_index must be 1-D (N,), got shape {tuple(seq_index.shape)}")
    if seq_index.dtype not in (torch.int64, torch.int32):
        raise AlgorithmError(f"seq_index must be an integer tensor, got {seq_index.dtype}")
    n = seq_index.shape[0]
    for name, t in tensors:
        if t is not None and tuple(t.shape) != (n,):
            raise AlgorithmError(f"{name} must have shape ({n},) like seq_index, got {tuple(t.shape)}")
    return n


def resolve_num_seqs(seq_index: torch.Tensor, num_seqs: int | None) -> int:
    """`num_seqs` if given, else max(seq_index) + 1 (one host sync; pass num_seqs to avoid it)."""
    if num_seqs is not None:
        if num_seqs < 0:
            raise AlgorithmError(f"num_seqs must be >= 0, got {num_seqs}")
        return num_seqs
    return int(seq_index.max().item()) + 1 if seq_index.numel() else 0


def seq_sum(values: torch.Tensor, seq_index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Sum of `values` (N,) per sequence -> (S,). Differentiable."""
    out = torch.zeros(num_seqs, dtype=values.dtype, device=values.device)
    return out.index_add(0, seq_index.long(), values)


def seq_count(seq_index: torch.Tensor, num_seqs: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Number of tokens of each sequence -> (S,)."""
    ones = torch.ones(seq_index.shape[0], dtype=dtype, device=seq_index.device)
    return seq_sum(ones, seq_index, num_seqs)


def seq_mean(values: torch.Tensor, seq_index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Mean of `values` (N,) per sequence -> (S,); a sequence without tokens gets 0."""
    counts = seq_count(seq_index, num_seqs, values.dtype)
    return seq_sum(values, seq_index, num_seqs) / counts.clamp(min=1)


def flatten_masked(mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Padded (B, T) tensors -> flat loss tokens: returns (seq_index, *flat), seq_index = the row.

    For callers with padded batches: `seq_index, logp, prox = flatten_masked(loss_mask, logp, prox)`,
    then `compute_token_loss(..., seq_index, num_seqs=B)`. Order is row-major, as `t[mask]`.
    """
    if mask.dim() != 2:
        raise AlgorithmError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    for i, t in enumerate(tensors):
        if t.shape != mask.shape:
            raise AlgorithmError(f"tensor {i} has shape {tuple(t.shape)}, mask has {tuple(mask.shape)}")
    keep = mask.bool()
    rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1).expand_as(keep)
    return (rows[keep], *(t[keep] for t in tensors))
