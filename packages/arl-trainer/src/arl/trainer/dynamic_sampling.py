"""DAPO dynamic sampling: drop prompt groups whose responses all earned the same reward.

Such a group has zero group-relative advantage everywhere, so it adds no gradient but dilutes the
batch (DAPO, Yu et al. 2025). Every drop is counted by reason, never silent; the trainer keeps
pulling samples until its batch is full of informative groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import torch

from arl.queue.types import Sample
from arl.trainer.errors import AlgorithmError
from arl.trainer.segments import check_flat, resolve_num_seqs


class DynamicSamplingResult(msgspec.Struct, kw_only=True):
    """Groups kept and how many were dropped for which reason."""

    kept: list[Sample]
    # Groups whose ≥ 2 responses all have one reward (within atol).
    dropped_uniform_reward: int = 0
    # Groups with fewer than 2 responses (no spread can exist).
    dropped_single_response: int = 0

    @property
    def counts(self) -> dict[str, int]:
        return {
            "kept": len(self.kept),
            "dropped_uniform_reward": self.dropped_uniform_reward,
            "dropped_single_response": self.dropped_single_response,
        }


def group_has_variance(rewards: Sequence[float], atol: float = 0.0) -> bool:
    """True when the rewards are not all equal (max − min > atol); False for fewer than two."""
    return len(rewards) >= 2 and max(rewards) - min(rewards) > atol


def filter_zero_variance_groups(samples: Sequence[Sample], *, atol: float = 0.0) -> DynamicSamplingResult:
    """Keep the samples (groups) whose responses' rewards differ; count the rest by reason. Order is kept."""
    if atol < 0:
        raise AlgorithmError(f"atol must be >= 0, got {atol}")
    kept: list[Sample] = []
    uniform = single = 0
    for sample in samples:
        rewards = [r.reward for r in sample.responses]
        if len(rewards) < 2:
            single += 1
        elif group_has_variance(rewards, atol):
            kept.append(sample)
        else:
            uniform += 1
    return DynamicSamplingResult(kept=kept, dropped_uniform_reward=uniform, dropped_single_response=single)


def informative_groups(
    rewards: torch.Tensor, group_index: torch.Tensor, *, atol: float = 0.0
) -> torch.Tensor:
    """Tensor form: (G,) bool, True for groups with ≥ 2 responses whose rewards span more than atol."""
    check_flat(group_index, ("rewards", rewards))
    g = resolve_num_seqs(group_index, None)
    idx = group_index.long()
    hi = torch.full((g,), float("-inf"), dtype=rewards.dtype, device=rewards.device).scatter_reduce(
        0, idx, rewards, "amax"
    )
    lo = torch.full((g,), float("inf"), dtype=rewards.dtype, device=rewards.device).scatter_reduce(
        0, idx, rewards, "amin"
    )
    counts = torch.zeros(g, dtype=torch.long, device=rewards.device).index_add(0, idx, torch.ones_like(idx))
    return (counts >= 2) & (hi - lo > atol)


def groups_of_one(samples: Sequence[Sample]) -> dict[str, int]:
    """Trained groups with a single trajectory: GRPO, Dr. GRPO and RLOO give it advantage 0 (no baseline,
    so no signal), so it contributes nothing but its tokens to the denominators.

    `groups_of_one`: such groups among `samples` (a step's batch); `groups_of_one_failed`: those of them
    that lost members, i.e. are smaller than the step's largest group. Failed trajectories are the only
    way a group loses members (the rollouter drops a failed trajectory and keeps its siblings); dynamic
    sampling and the version-lag bound keep or drop whole groups, never part of one. A run with
    rollout.n = 1 has only groups of one, none of them "failed".
    """
    sizes = [len(s.responses) for s in samples]
    full = max(sizes, default=0)
    one = sum(n == 1 for n in sizes)
    return {"groups_of_one": one, "groups_of_one_failed": one if full > 1 else 0}
