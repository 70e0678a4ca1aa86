"""From an arl-proxy `Trajectory` to an `AgentResult`: the first segment in the flat fields, all carried.

Agent loops that talk to the model through arl-proxy (the tool loop, Harbor trials) end with a
`Trajectory` whose segments hold every sampled token exactly once; this is the one place that turns it
into the rollout side's result, so no loop keeps only one sequence by accident.
"""

from __future__ import annotations

from typing import Any

from arl.proxy.types import Trajectory
from arl.rollout.types import AgentResult


def result_from_trajectory(trajectory: Trajectory, *, reward: float, **fields: Any) -> AgentResult:
    """The `AgentResult` of `trajectory` (`fields`: finish_reason, rewards, timings, ...).

    The flat fields hold the first segment (its prompt is the group's prompt); `segments` holds them all
    when there is more than one.
    """
    segments = trajectory.segments
    first = segments[0] if segments else None
    ids = list(first.response_ids) if first else []
    n = len(ids)
    versions = first.weight_versions if first is not None else None
    fields.setdefault("num_turns", trajectory.num_turns)
    fields.setdefault(
        "tool_calls",
        sum(len(m.get("tool_calls") or []) for m in trajectory.messages if m.get("role") == "assistant"),
    )
    fields.setdefault("rebuilds", trajectory.rebuilds)
    fields.setdefault("dropped_turns", trajectory.dropped_turns)
    return AgentResult(
        prompt_ids=list(first.prompt_ids) if first else [],
        response_ids=ids,
        response_mask=list(first.response_mask) if first else [],
        response_logprobs=list(first.response_logprobs) if first else [],
        weight_versions=list(versions) if versions is not None else [-1] * n,
        reward=reward,
        routed_experts=list(first.routed_experts)
        if first is not None and first.routed_experts is not None
        else None,
        segments=list(segments) if len(segments) > 1 else [],
        sampled_tokens=trajectory.generated_tokens,
        **fields,
    )
