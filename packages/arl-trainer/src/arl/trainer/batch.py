"""Batch assembly: Samples (one prompt, n responses) into right-padded training tensors.

Every response becomes one row `prompt + response` (the response's own prompt where it carries one); `loss_mask` is 1 exactly on the response tokens
the policy sampled (response_mask 1), so template backfill and tool output are never trained on.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataclasses import dataclass, fields

import torch

from arl.queue.types import Response, Sample
from arl.trainer.errors import BatchError


@dataclass
class TrainBatch:
    """Tensors of one batch (B rows, T tokens), plus per-row bookkeeping."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float: 1 on sampled response tokens
    behaviour_logp: torch.Tensor  # (B, T) float: the rollout engine's log probs where loss_mask is 1
    token_versions: torch.Tensor  # (B, T) long: weight version per sampled token, -1 elsewhere
    rewards: torch.Tensor  # (B,) float
    group_index: torch.Tensor  # (B,) long: rows of one prompt share an index
    response_lengths: torch.Tensor  # (B,) long

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
    for g, sample in enumerate(samples):
        for r in sample.responses:
            prompt = response_prompt(sample, r)
            p = len(prompt)
            n = len(r.response_ids)
            if not (len(r.response_mask) == len(r.response_logprobs) == len(r.weight_versions) == n):
                raise BatchError(
                    f"sample {sample.uid}: response fields differ in length (ids {n}, mask {len(r.response_mask)}, "
                    f"logprobs {len(r.response_logprobs)}, versions {len(r.weight_versions)})"
                )
            ids = list(prompt) + list(r.response_ids)
            mask = [0.0] * p + [float(m) for m in r.response_mask]
            behaviour = [0.0] * p + [lp if m else 0.0 for lp, m in zip(r.response_logprobs, r.response_mask)]
            versions = [-1] * p + [v if m else -1 for v, m in zip(r.weight_versions, r.response_mask)]
            rows.append((ids, [1] * len(ids), mask, behaviour, versions))
            rewards.append(r.reward)
            groups.append(g)
            resp_lens.append(n)
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
    )
