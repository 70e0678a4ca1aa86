"""The wire schema of a sample: the only thing that crosses from the rollout side to the trainer.

A `Sample` is one prompt with its group of `n` responses (GRPO needs the whole group to compute
advantages), matching the reference design where one queue item is one prompt's rollouts. It is a
msgspec struct, encoded to msgpack on the way through the queue; `SCHEMA_VERSION` is bumped on any
schema change and checked on decode. Versions in `READABLE_SCHEMA_VERSIONS` still decode (their missing
fields take their defaults) and come out upgraded to `SCHEMA_VERSION`.

History: 1 = the first schema; 2 = packed routed experts (main's `RoutedExperts`, merged separately);
3 = `Response.prompt_ids` (a trajectory may render its own prompt). Every change since 1 added an
optional field (or retyped one that is None unless MoE routing was recorded), so 1 and 2 still read.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SCHEMA_VERSION = 3
# Older versions whose bytes still decode (every field added since has a default).
READABLE_SCHEMA_VERSIONS = frozenset({1, 2, 3})


class RoutedExperts(msgspec.Struct, kw_only=True, frozen=True):
    """Per-token MoE routing, packed: C-order `data` of shape (tokens, layers, top_k) in `dtype`.

    Row i is the expert ids the engine chose in the forward step that sampled response token i.
    A row of all `dtype`'s maximum value (255 / 65535) means "no engine routing; the trainer routes".
    Build and read it with `arl.queue.routed_experts` (pack_routes / unpack_routes).
    """

    data: bytes
    shape: tuple[int, int, int]
    dtype: Literal["uint8", "uint16"] = "uint8"


class Response(msgspec.Struct, kw_only=True):
    """One trajectory: the token-exact record of what the policy produced for a prompt."""

    # Everything after the prompt: sampled tokens and (for multi-turn) tool/user tokens in between.
    response_ids: list[int]
    # 1 = token sampled by the policy (trained on), 0 = anything else (tool output, template backfill).
    response_mask: list[int]
    # Log prob under the sampling policy where mask is 1; 0.0 where mask is 0.
    response_logprobs: list[float]
    # Weight version that sampled each token where mask is 1; -1 where mask is 0.
    weight_versions: list[int]
    reward: float
    finish_reason: str = "stop"
    num_turns: int = 1
    # Named reward components (e.g. {"correct": 1.0, "format": 0.5}) when the task reports them.
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    # MoE routing per response token (packed; see RoutedExperts), None for dense models / unrecorded.
    routed_experts: RoutedExperts | None = None
    # This trajectory's own prompt when it differs from `Sample.prompt_ids` (an agent that renders its
    # first turn itself: a first-turn context overflow, a prompt showing the sandbox's hostname); None =
    # the sample's. Readers use `response.prompt_ids if response.prompt_ids is not None else
    # sample.prompt_ids` (`Sample.prompt_of`). Added in schema 3.
    prompt_ids: list[int] | None = None


class Sample(msgspec.Struct, kw_only=True):
    """One prompt and its `n` responses, as produced by the rollout side."""

    uid: str
    prompt_ids: list[int]
    responses: list[Response]
    # Weight version the rollouter held when this sample's generation started / finished.
    start_version: int
    end_version: int
    task_id: str = ""
    # Free-form metadata of the task (e.g. the ground truth) and timings in seconds (e.g. "generate").
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def prompt_of(self, response: Response) -> list[int]:
        """The prompt token ids `response` continues: its own when set, else the sample's."""
        return response.prompt_ids if response.prompt_ids is not None else self.prompt_ids

    def min_token_version(self) -> int:
        """Oldest weight version that sampled any trained token of this sample (its staleness anchor)."""
        versions = [v for r in self.responses for v in r.weight_versions if v >= 0]
        return min(versions) if versions else self.start_version


# What a full queue does with a new sample: "block" waits for space (put may time out and return
# False); "drop_oldest" evicts the oldest queued sample (counted in `QueueStats.dropped`).
OverflowPolicy = Literal["block", "drop_oldest"]


class QueueStats(msgspec.Struct, kw_only=True):
    """Counters of a `MessageQueue` since it was created (restored samples count as put)."""

    # Samples currently queued.
    size: int
    # Capacity (max_size) of the queue.
    max_size: int
    # Largest number of samples queued at once.
    peak_size: int
    total_put: int
    total_got: int
    # Samples evicted by the "drop_oldest" overflow policy (always 0 with "block").
    dropped: int
    # Blocking puts that timed out and returned False (the caller still holds those samples).
    put_timeouts: int
    # Samples loaded from a snapshot at construction.
    restored: int
    closed: bool
