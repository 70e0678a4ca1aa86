"""Batch assembly: Samples (one prompt, n responses) into right-padded training tensors.

Every segment of every response becomes one row `prompt + response` (a response whose history was
never rewritten has one segment: its prompt, or its own prompt where it carries one, and its fields;
see `arl.queue.iter_segment_rows`). `loss_mask` is 1 exactly on the response tokens the policy sampled
(response_mask 1), so template backfill and tool output are never trained on, and each sampled token
is in exactly one row. Rows of one trajectory share `trajectory_index`: they take its advantage, and
`trajectory_advantages` counts each trajectory once in its group's statistics.

The queue's per-token fields are packed arrays (`arl.queue.packed`): rows are filled from
`torch.frombuffer` views of them, without a Python loop per token (lists still work, converted).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from arl.queue.errors import SegmentError
from arl.queue.segments import iter_segment_rows
from arl.queue.types import Sample
from arl.trainer.advantages import AdvantageEstimator, compute_advantages, kl_penalized_rewards
from arl.trainer.errors import BatchError


@dataclass
class TrainBatch:
    """Tensors of one batch (B rows, T tokens), plus per-row bookkeeping."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float: 1 on sampled response tokens
    behaviour_logp: torch.Tensor  # (B, T) float: the rollout engine's log probs where loss_mask is 1
    token_versions: torch.Tensor  # (B, T) long: weight version per sampled token, -1 elsewhere
    rewards: torch.Tensor  # (B,) float: the row's trajectory's reward
    group_index: torch.Tensor  # (B,) long: rows of one prompt share an index
    response_lengths: torch.Tensor  # (B,) long
    # (B,) long: the rows (segments) of one trajectory share an index; one row per trajectory without rewrites.
    trajectory_index: torch.Tensor

    def rows(self, index: torch.Tensor) -> TrainBatch:
        """A sub-batch of the given rows (for mini-batches)."""
        return TrainBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


_TORCH_DTYPE = {"i": torch.int32, "f": torch.float32, "B": torch.uint8}


def _tokens(values: Any, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of a per-token field: a zero-copy view of a packed array, else built from the list."""
    if isinstance(values, array) and values.typecode in _TORCH_DTYPE and len(values):
        return torch.frombuffer(values, dtype=_TORCH_DTYPE[values.typecode])
    return torch.tensor(list(values), dtype=dtype)


def assemble_batch(samples: Sequence[Sample], pad_token_id: int) -> TrainBatch:
    try:
        segment_rows = list(iter_segment_rows(samples))
    except SegmentError as exc:
        raise BatchError(str(exc)) from exc
    if not segment_rows:
        raise BatchError("no responses to assemble")
    lengths = [(len(item.row.prompt_ids), len(item.row.response_ids)) for item in segment_rows]
    shape = (len(segment_rows), max(p + n for p, n in lengths))
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    behaviour_logp = torch.zeros(shape, dtype=torch.float32)
    token_versions = torch.full(shape, -1, dtype=torch.long)
    for b, (item, (p, n)) in enumerate(zip(segment_rows, lengths, strict=True)):
        seg = item.row
        input_ids[b, :p] = _tokens(seg.prompt_ids, torch.long)
        input_ids[b, p : p + n] = _tokens(seg.response_ids, torch.long)
        attention_mask[b, : p + n] = 1
        mask = _tokens(seg.response_mask, torch.float32).float()
        sampled = mask != 0
        loss_mask[b, p : p + n] = mask
        # Log probs and versions only where the policy sampled (the queue's convention; enforced here).
        behaviour_logp[b, p : p + n] = (
            _tokens(seg.response_logprobs, torch.float32).float().masked_fill(~sampled, 0.0)
        )
        token_versions[b, p : p + n] = (
            _tokens(seg.weight_versions, torch.long).long().masked_fill(~sampled, -1)
        )
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behaviour_logp=behaviour_logp,
        token_versions=token_versions,
        rewards=torch.tensor([item.reward for item in segment_rows], dtype=torch.float32),
        group_index=torch.tensor([item.group for item in segment_rows], dtype=torch.long),
        response_lengths=torch.tensor([n for _, n in lengths], dtype=torch.long),
        trajectory_index=torch.tensor([item.trajectory for item in segment_rows], dtype=torch.long),
    )


def _per_trajectory(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards, group index) per trajectory, and each row's trajectory (0..n-1)."""
    uniq, row_traj = torch.unique(batch.trajectory_index, return_inverse=True)
    rewards = torch.zeros(uniq.shape[0], dtype=batch.rewards.dtype).scatter_(0, row_traj, batch.rewards)
    groups = torch.zeros(uniq.shape[0], dtype=torch.long).scatter_(0, row_traj, batch.group_index)
    return rewards, groups, row_traj


def trajectory_rewards(batch: TrainBatch) -> torch.Tensor:
    """One reward per trajectory (however many segments it has), for metrics."""
    return _per_trajectory(batch)[0]


def trajectory_advantages(
    batch: TrainBatch,
    *,
    estimator: AdvantageEstimator = "grpo",
    token_kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Advantages (B,) per row by `estimator`: computed over trajectories, so the segments of one
    trajectory count once in their group's statistics, then each row takes its trajectory's advantage.

    KL in the reward: `token_kl` (B, T), a per-token KL(π ‖ π_ref) estimate; each trajectory's reward
    first loses `kl_coef` × the sum of its trained tokens' KL over all its segments
    (`advantages.kl_penalized_rewards`)."""
    rewards, groups, row_traj = _per_trajectory(batch)
    if token_kl is not None and kl_coef > 0:
        if token_kl.shape != batch.loss_mask.shape:
            raise BatchError(
                f"token_kl of shape {tuple(token_kl.shape)} does not match the batch's {tuple(batch.loss_mask.shape)}"
            )
        trained = batch.loss_mask > 0
        seq_index = row_traj[:, None].expand_as(trained)[trained]
        rewards = kl_penalized_rewards(rewards, token_kl[trained], seq_index, kl_coef)
    return compute_advantages(estimator, rewards, groups)[row_traj]
