"""Batch assembly: Samples (one prompt, n responses) into right-padded training tensors.

Every segment of every response becomes one row `prompt + response` (a response whose history was
never rewritten has one segment: its prompt, or its own prompt where it carries one, and its fields;
see `arl.queue.iter_segment_rows`). `loss_mask` is 1 exactly on the response tokens the policy sampled
(response_mask 1), so template backfill and tool output are never trained on, and each sampled token
is in exactly one row. Rows of one trajectory share `trajectory_index`: they take its advantage, and
`trajectory_advantages` counts each trajectory once in its group's statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from arl.queue.errors import SegmentError
from arl.queue.segments import iter_segment_rows
from arl.queue.types import Response, Sample
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


def response_prompt(sample: Sample, response: Response) -> list[int]:
    """The prompt a response continues: its own (`Response.prompt_ids`, where the schema has it) else the sample's."""
    own = getattr(response, "prompt_ids", None)
    return own if own is not None else sample.prompt_ids


def assemble_batch(samples: Sequence[Sample], pad_token_id: int) -> TrainBatch:
    rows: list[tuple[list[int], list[int], list[float], list[float], list[int]]] = []
    rewards: list[float] = []
    groups: list[int] = []
    resp_lens: list[int] = []
    trajectories: list[int] = []
    try:
        segment_rows = list(iter_segment_rows(samples))
    except SegmentError as exc:
        raise BatchError(str(exc)) from exc
    for item in segment_rows:
        seg = item.row
        p = len(seg.prompt_ids)
        n = len(seg.response_ids)
        ids = list(seg.prompt_ids) + list(seg.response_ids)
        mask = [0.0] * p + [float(m) for m in seg.response_mask]
        behaviour = [0.0] * p + [lp if m else 0.0 for lp, m in zip(seg.response_logprobs, seg.response_mask)]
        versions = [-1] * p + [v if m else -1 for v, m in zip(seg.weight_versions, seg.response_mask)]
        rows.append((ids, [1] * len(ids), mask, behaviour, versions))
        rewards.append(item.reward)
        groups.append(item.group)
        resp_lens.append(n)
        trajectories.append(item.trajectory)
    if not rows:
        raise BatchError("no responses to assemble")
    width = max(len(r[0]) for r in rows)

    def pad(column: int, value: float | int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r[column] + [value] * (width - len(r[column])) for r in rows], dtype=dtype)

    return TrainBatch(
        input_ids=pad(0, pad_token_id, torch.long),
        attention_mask=pad(1, 0, torch.long),
        loss_mask=pad(2, 0.0, torch.float32),
        behaviour_logp=pad(3, 0.0, torch.float32),
        token_versions=pad(4, -1, torch.long),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_index=torch.tensor(groups, dtype=torch.long),
        response_lengths=torch.tensor(resp_lens, dtype=torch.long),
        trajectory_index=torch.tensor(trajectories, dtype=torch.long),
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


def trajectory_advantages(batch: TrainBatch, *, estimator: AdvantageEstimator = "grpo",
                          token_kl: torch.Tensor | None = None, kl_coef: float = 0.0) -> torch.Tensor:
    """Advantages (B,) per row by `estimator`: computed over trajectories, so the segments of one
    trajectory count once in their group's statistics, then each row takes its trajectory's advantage.

    KL in the reward: `token_kl` (B, T), a per-token KL(π ‖ π_ref) estimate; each trajectory's reward
    first loses `kl_coef` × the sum of its trained tokens' KL over all its segments
    (`advantages.kl_penalized_rewards`)."""
    rewards, groups, row_traj = _per_trajectory(batch)
    if token_kl is not None and kl_coef > 0:
        if token_kl.shape != batch.loss_mask.shape:
            raise BatchError(f"token_kl of shape {tuple(token_kl.shape)} does not match the batch's {tuple(batch.loss_mask.shape)}")
        trained = batch.loss_mask > 0
        seq_index = row_traj[:, None].expand_as(trained)[trained]
        rewards = kl_penalized_rewards(rewards, token_kl[trained], seq_index, kl_coef)
    return compute_advantages(estimator, rewards, groups)[row_traj]
