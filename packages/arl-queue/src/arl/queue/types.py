"""The wire schema of a sample: the only thing that crosses from the rollout side to the trainer.

A `Sample` is one prompt with its group of `n` responses (GRPO needs the whole group to compute
advantages), matching the reference design where one queue item is one prompt's rollouts. It is a
msgspec struct, encoded to msgpack on the way through the queue; `SCHEMA_VERSION` is bumped on any
schema change and checked on decode. Versions in `READABLE_SCHEMA_VERSIONS` still decode (fields added
since take their defaults; older encodings are converted, see `codec`) and come out as `SCHEMA_VERSION`.

History: 1 = the first schema; 2 = `Response.routed_experts` packed as `RoutedExperts`;
3 = `Response.prompt_ids` (a trajectory may render its own prompt); 4 = `Response.next_segments` (a
trajectory's token-exact segments after its first); 5 = every per-token field packed (`arl.queue.packed`:
int32 token ids and weight versions, float32 log probs, uint8 masks, each one msgpack `bin`).

The per-token fields hold packed arrays (`Int32Array`, `Float32Array`, `UInt8Array`) that read like
lists; constructors take lists (or any iterable of numbers) and pack them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from arl.queue.errors import SegmentError
from arl.queue.packed import Float32Array, Int32Array, UInt8Array, coerce

SCHEMA_VERSION = 5
# Versions whose bytes still decode (see `arl.queue.codec.decode_sample`).
READABLE_SCHEMA_VERSIONS = frozenset({1, 2, 3, 4, 5})

# The packed per-token fields of a response (and of a segment), with their array types.
_TOKEN_FIELDS: tuple[tuple[str, type[Int32Array | Float32Array | UInt8Array]], ...] = (
    ("response_ids", Int32Array),
    ("response_mask", UInt8Array),
    ("response_logprobs", Float32Array),
    ("weight_versions", Int32Array),
)


def _pack_fields(
    obj: Any, fields: tuple[tuple[str, type[Int32Array | Float32Array | UInt8Array]], ...]
) -> None:
    """Replace list-valued fields of `obj` by their packed arrays (no-op for arrays and None)."""
    for name, cls in fields:
        value = getattr(obj, name)
        if value is not None and type(value) is not cls:
            setattr(obj, name, coerce(value, cls, name))


def _count_ones(mask: Any) -> int:
    return mask.count_nonzero() if isinstance(mask, UInt8Array) else sum(mask)


class RoutedExperts(msgspec.Struct, kw_only=True, frozen=True):
    """Per-token MoE routing, packed: C-order `data` of shape (tokens, layers, top_k) in `dtype`.

    Row i is the expert ids the engine chose in the forward step that sampled response token i.
    A row of all `dtype`'s maximum value (255 / 65535) means "no engine routing; the trainer routes".
    Build and read it with `arl.queue.routed_experts` (pack_routes / unpack_routes).
    """

    data: bytes
    shape: tuple[int, int, int]
    dtype: Literal["uint8", "uint16"] = "uint8"


class PackedSegment(msgspec.Struct, kw_only=True, array_like=True):
    """A trajectory's segment after its first, stored compactly against the segment before it.

    A trajectory is a list of token-exact segments (see `arl.proxy.Segment`): a new one starts where the
    chat template or the agent rewrote earlier turns, so its prompt repeats most of the previous
    segment's tokens. Only the prompt tokens past that shared prefix travel.
    """

    # Leading prompt tokens equal to the previous segment's prompt + response.
    shared_prefix: int
    # The prompt tokens after the shared prefix.
    prompt_tail: Int32Array
    response_ids: Int32Array
    # Same meanings as on `Response`: 1 = sampled here (trained on), log prob where 1 (0.0 elsewhere),
    # weight version where 1 (-1 elsewhere), routing where 1 ([] elsewhere).
    response_mask: UInt8Array
    response_logprobs: Float32Array
    weight_versions: Int32Array
    routed_experts: RoutedExperts | None = None

    def __post_init__(self) -> None:
        _pack_fields(self, (("prompt_tail", Int32Array), *_TOKEN_FIELDS))


class SegmentRow(msgspec.Struct, kw_only=True):
    """One segment of a trajectory laid out whole, ready to become one training row (in memory only)."""

    prompt_ids: Int32Array
    response_ids: Int32Array
    response_mask: UInt8Array
    response_logprobs: Float32Array
    weight_versions: Int32Array
    routed_experts: RoutedExperts | None = None

    def __post_init__(self) -> None:
        _pack_fields(self, (("prompt_ids", Int32Array), *_TOKEN_FIELDS))


class Response(msgspec.Struct, kw_only=True):
    """One trajectory: the token-exact record of what the policy produced for a prompt.

    The fields below hold the trajectory's first segment (after `Sample.prompt_ids`); `next_segments`
    holds the others, when the history was rewritten. `Sample.segments_of(response)` lays them all out.
    """

    # Everything after the prompt: sampled tokens and (for multi-turn) tool/user tokens in between.
    response_ids: Int32Array
    # 1 = token sampled by the policy (trained on), 0 = anything else (tool output, template backfill).
    response_mask: UInt8Array
    # Log prob under the sampling policy where mask is 1; 0.0 where mask is 0.
    response_logprobs: Float32Array
    # Weight version that sampled each token where mask is 1; -1 where mask is 0.
    weight_versions: Int32Array
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
    prompt_ids: Int32Array | None = None
    # The trajectory's segments after the first, in order (see `PackedSegment`); [] = one segment.
    next_segments: list[PackedSegment] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        _pack_fields(self, (*_TOKEN_FIELDS, ("prompt_ids", Int32Array)))

    @property
    def num_segments(self) -> int:
        return 1 + len(self.next_segments)

    @property
    def num_trained(self) -> int:
        """Tokens with mask 1 over all segments (each sampled token once)."""
        return _count_ones(self.response_mask) + sum(_count_ones(s.response_mask) for s in self.next_segments)


class Sample(msgspec.Struct, kw_only=True):
    """One prompt and its `n` responses, as produced by the rollout side."""

    uid: str
    prompt_ids: Int32Array
    responses: list[Response]
    # Weight version the rollouter held when this sample's generation started / finished.
    start_version: int
    end_version: int
    task_id: str = ""
    # Free-form metadata of the task (e.g. the ground truth) and timings in seconds (e.g. "generate").
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _pack_fields(self, (("prompt_ids", Int32Array),))

    def segments_of(self, response: Response) -> list[SegmentRow]:
        """Every segment of `response`, each laid out whole (prompt tokens expanded), in order."""
        first = SegmentRow(
            prompt_ids=Int32Array(self.prompt_of(response)),
            response_ids=response.response_ids,
            response_mask=response.response_mask,
            response_logprobs=response.response_logprobs,
            weight_versions=response.weight_versions,
            routed_experts=response.routed_experts,
        )
        rows = [first]
        for k, seg in enumerate(response.next_segments, start=1):
            prev = rows[-1]
            p = len(prev.prompt_ids)
            full = p + len(prev.response_ids)
            if not 0 <= seg.shared_prefix <= full:
                raise SegmentError(
                    f"sample {self.uid}: segment {k} shares {seg.shared_prefix} tokens with a "
                    f"previous segment of {full}"
                )
            shared = seg.shared_prefix
            head = (
                prev.prompt_ids[:shared] if shared <= p else prev.prompt_ids + prev.response_ids[: shared - p]
            )
            rows.append(
                SegmentRow(
                    prompt_ids=head + seg.prompt_tail,
                    response_ids=seg.response_ids,
                    response_mask=seg.response_mask,
                    response_logprobs=seg.response_logprobs,
                    weight_versions=seg.weight_versions,
                    routed_experts=seg.routed_experts,
                )
            )
        return rows

    def prompt_of(self, response: Response) -> Int32Array:
        """The prompt token ids `response` continues: its own when set, else the sample's."""
        return response.prompt_ids if response.prompt_ids is not None else self.prompt_ids

    def min_token_version(self) -> int:
        """Oldest weight version that sampled any trained token of this sample (its staleness anchor)."""
        # A set of each array first: a handful of distinct versions, gathered without a Python loop per token.
        distinct: set[int] = set()
        for r in self.responses:
            distinct.update(r.weight_versions)
            for s in r.next_segments:
                distinct.update(s.weight_versions)
        trained = [v for v in distinct if v >= 0]
        return min(trained) if trained else self.start_version


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
