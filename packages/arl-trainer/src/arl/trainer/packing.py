"""Balanced packing of variable-length sequences: into data-parallel ranks, then into micro-batches.

Work per sequence is modelled as cost(s) = a·s + b·s² (linear layers plus causal attention), so two
ranks that hold the same number of tokens but different length mixes are still balanced by time.
`plan_packing` cuts a mini-batch into world_size × m groups of near-equal cost (longest-processing-time
first under the `max_tokens` budget, m as small as the budget allows) and deals them to ranks so every
rank runs m micro-batches (FSDP needs the same collectives on every rank) and the micro-batches that
run side by side cost the same. `partition_balanced` (Karmarkar–Karp) splits items into k equal-cost
parts where no budget applies.

Everything here is plain Python on lengths: deterministic, so every rank computes the same plan.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from arl.trainer.errors import BatchError


@dataclass(frozen=True)
class CostModel:
    """cost(s) = linear·s + quadratic·s² (relative units: only ratios matter)."""

    linear: float = 1.0
    quadratic: float = 0.0

    def __call__(self, length: int) -> float:
        return self.linear * length + self.quadratic * length * length

    @staticmethod
    def for_model(hidden_size: int, num_layers: int, num_params: int) -> CostModel:
        """Per-token matmul FLOPs 6·N against causal attention 6·s·d·L (per token, per unit of s)."""
        return CostModel(linear=6.0 * num_params, quadratic=6.0 * hidden_size * num_layers)


def partition_balanced(lengths: Sequence[int], parts: int, cost: CostModel = CostModel()) -> list[list[int]]:
    """Indices of `lengths` split into `parts` groups of near-equal total cost (Karmarkar–Karp).

    Each group is sorted; with fewer items than parts some groups are empty.
    """
    if parts < 1:
        raise BatchError(f"parts must be >= 1, got {parts}")
    if parts == 1:
        return [list(range(len(lengths)))]
    # Each heap entry is a `parts`-tuple of (cost, indices) sorted by cost descending; repeatedly merge
    # the two entries with the largest spread, pairing the heaviest subset of one with the lightest of the other.
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for i, s in enumerate(lengths):
        subsets = [(cost(s), [i])] + [(0.0, []) for _ in range(parts - 1)]
        heapq.heappush(heap, (-cost(s), i, subsets))
    tie = len(lengths)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(ca + cb, ia + ib) for (ca, ia), (cb, ib) in zip(a, reversed(b))]
        merged.sort(key=lambda x: -x[0])
        tie += 1
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
    if not heap:
        return [[] for _ in range(parts)]
    return [sorted(ix) for _, ix in heap[0][2]]


def _lpt_with_budget(
    lengths: Sequence[int], groups: int, max_tokens: int, cost: CostModel
) -> list[list[int]] | None:
    """Longest-processing-time first: each sequence (costliest first) joins the cheapest group it fits in.

    None when some sequence fits in no group (the caller then tries more groups).
    """
    heap = [(0.0, g) for g in range(groups)]
    members: list[list[int]] = [[] for _ in range(groups)]
    tokens = [0] * groups
    for i in sorted(range(len(lengths)), key=lambda j: (-cost(lengths[j]), j)):
        skipped = []
        while heap:
            c, g = heapq.heappop(heap)
            if tokens[g] + lengths[i] <= max_tokens:
                members[g].append(i)
                tokens[g] += lengths[i]
                heapq.heappush(heap, (c + cost(lengths[i]), g))
                break
            skipped.append((c, g))
        else:
            return None
        for item in skipped:
            heapq.heappush(heap, item)
    return members


@dataclass(frozen=True)
class PackPlan:
    """Which sequences each rank runs in each micro-batch: plan.ranks[rank][micro] = sorted row indices."""

    ranks: list[list[list[int]]]
    max_tokens: int

    @property
    def num_microbatches(self) -> int:
        return len(self.ranks[0])

    def tokens(self, lengths: Sequence[int]) -> list[list[int]]:
        return [[sum(lengths[i] for i in mb) for mb in rank] for rank in self.ranks]

    def stats(self, lengths: Sequence[int], cost: CostModel = CostModel()) -> dict[str, float]:
        """pack_fill: real tokens / (micro-batches × ranks × budget);
        rank_imbalance: max/mean of the ranks' total cost − 1;
        sync_idle: the share of rank-time spent waiting, when every micro-batch ends in a collective
        (each micro-batch step lasts as long as its costliest rank's)."""
        toks = self.tokens(lengths)
        capacity = self.num_microbatches * len(self.ranks) * self.max_tokens
        mb_cost = [[sum(cost(lengths[i]) for i in mb) for mb in rank] for rank in self.ranks]
        rank_cost = [sum(r) for r in mb_cost]
        mean_cost = sum(rank_cost) / len(rank_cost)
        span = sum(max(r[j] for r in mb_cost) for j in range(self.num_microbatches)) * len(self.ranks)
        return {
            "pack_fill": sum(map(sum, toks)) / capacity if capacity else 1.0,
            "rank_imbalance": (max(rank_cost) / mean_cost - 1.0) if mean_cost > 0 else 0.0,
            "sync_idle": 1.0 - sum(rank_cost) / span if span > 0 else 0.0,
            "microbatches": float(self.num_microbatches),
        }


def plan_packing(
    lengths: Sequence[int], *, world_size: int = 1, max_tokens: int, cost: CostModel = CostModel()
) -> PackPlan:
    """Micro-batches for every rank: world_size × m groups of near-equal cost, each within `max_tokens`.

    m starts at the token lower bound ceil(total / (world_size × max_tokens)) and grows only when the
    cost-balanced groups cannot respect the budget. Groups are dealt to ranks by cost rank (snake
    order), so the micro-batches that run at the same time on different ranks cost about the same
    (little waiting at each micro-batch's collectives) and the ranks' totals match.
    """
    if max_tokens < 1:
        raise BatchError(f"max_tokens_per_microbatch must be >= 1, got {max_tokens}")
    if world_size < 1:
        raise BatchError(f"world_size must be >= 1, got {world_size}")
    too_long = [s for s in lengths if s > max_tokens]
    if too_long:
        raise BatchError(
            f"a sequence of {max(too_long)} tokens exceeds max_tokens_per_microbatch={max_tokens}; raise it"
        )
    m = max(1, -(-sum(lengths) // (world_size * max_tokens)))
    while (groups := _lpt_with_budget(lengths, world_size * m, max_tokens, cost)) is None:
        m += 1
    groups.sort(key=lambda g: (-sum(cost(lengths[i]) for i in g), g))
    ranks: list[list[list[int]]] = [[] for _ in range(world_size)]
    for j in range(m):
        step = groups[j * world_size : (j + 1) * world_size]
        if j % 2:
            step.reverse()
        for r, g in enumerate(step):
            ranks[r].append(sorted(g))
    return PackPlan(ranks=ranks, max_tokens=max_tokens)
