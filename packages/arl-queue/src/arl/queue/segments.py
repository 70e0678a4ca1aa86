"""Trajectory segments on the queue: packing them into a `Response` and laying them out as training rows.

A trajectory recorded by arl-proxy is a list of token-exact segments; each sampled token has mask 1 in
exactly one of them. On the wire the first segment is the `Response`'s own fields and each later one a
`PackedSegment` that stores only the prompt tokens past what it shares with the segment before it (a
rewritten history repeats most of it). `iter_segment_rows` gives the trainer one row per segment with the
indices it needs: every row of a trajectory takes that trajectory's advantage, and group statistics count
each trajectory once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, Protocol

import msgspec

from arl.queue.errors import SegmentError
from arl.queue.routed_experts import pack_routes
from arl.queue.types import PackedSegment, Response, RoutedExperts, Sample, SegmentRow


class SegmentLike(Protocol):
    """Anything with a segment's fields (`arl.proxy.Segment`, `SegmentRow`); versions may be None, routing
    may be per-token lists (as arl-proxy records it) or packed."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    weight_versions: list[int] | None
    routed_experts: Any


def _routes(seg: SegmentLike) -> RoutedExperts | None:
    routes = seg.routed_experts
    if routes is None or isinstance(routes, RoutedExperts):
        return routes
    return pack_routes(routes)


class TrainingRow(msgspec.Struct, kw_only=True, frozen=True):
    """One segment of one trajectory, with where it comes from."""

    group: int  # index of the sample (the prompt's group) in the batch
    trajectory: int  # running index of the response over the batch; the rows of one trajectory share it
    segment: int  # index of the segment within its trajectory
    reward: float  # the trajectory's reward (each of its rows is trained with the trajectory's advantage)
    row: SegmentRow


def _versions(seg: SegmentLike) -> list[int]:
    n = len(seg.response_ids)
    if seg.weight_versions is None:
        return [-1] * n
    return [v if m else -1 for v, m in zip(seg.weight_versions, seg.response_mask)]


def _check(seg: SegmentLike, k: int) -> None:
    n = len(seg.response_ids)
    lens = (
        len(seg.response_mask),
        len(seg.response_logprobs),
        n if seg.weight_versions is None else len(seg.weight_versions),
    )
    if any(x != n for x in lens):
        raise SegmentError(
            f"segment {k}: response fields differ in length (ids {n}, mask {lens[0]}, "
            f"logprobs {lens[1]}, versions {lens[2]})"
        )


def pack_segments(segments: Sequence[SegmentLike]) -> tuple[SegmentRow, list[PackedSegment]]:
    """The first segment whole (for the `Response`'s own fields) and the later ones packed against their
    predecessor. Missing weight versions become -1."""
    if not segments:
        raise SegmentError("a trajectory needs at least one segment")
    for k, seg in enumerate(segments):
        _check(seg, k)
    first = segments[0]
    head = SegmentRow(
        prompt_ids=list(first.prompt_ids),
        response_ids=list(first.response_ids),
        response_mask=list(first.response_mask),
        response_logprobs=list(first.response_logprobs),
        weight_versions=_versions(first),
        routed_experts=_routes(first),
    )
    packed = []
    for prev, seg in pairwise(segments):
        full = [*prev.prompt_ids, *prev.response_ids]
        limit = min(len(full), len(seg.prompt_ids))
        shared = 0
        while shared < limit and full[shared] == seg.prompt_ids[shared]:
            shared += 1
        packed.append(
            PackedSegment(
                shared_prefix=shared,
                prompt_tail=list(seg.prompt_ids[shared:]),
                response_ids=list(seg.response_ids),
                response_mask=list(seg.response_mask),
                response_logprobs=list(seg.response_logprobs),
                weight_versions=_versions(seg),
                routed_experts=_routes(seg),
            )
        )
    return head, packed


def response_from_segments(
    segments: Sequence[SegmentLike], *, group_prompt: list[int] | None = None, **fields: Any
) -> Response:
    """A `Response` carrying `segments`; `fields` are its other fields (reward, finish_reason, ...).

    `group_prompt` is the sample's prompt: where the first segment's prompt differs from it, the response
    carries its own (`Response.prompt_ids`, on schemas that have it)."""
    head, packed = pack_segments(segments)
    if group_prompt is not None and head.prompt_ids != group_prompt:
        fields["prompt_ids"] = head.prompt_ids
    return Response(
        response_ids=head.response_ids,
        response_mask=head.response_mask,
        response_logprobs=head.response_logprobs,
        weight_versions=head.weight_versions,
        routed_experts=head.routed_experts,
        next_segments=packed,
        **fields,
    )


def iter_segment_rows(samples: Sequence[Sample]) -> Iterator[TrainingRow]:
    """Every segment of every response of `samples`, in order, as a `TrainingRow`."""
    trajectory = 0
    for g, sample in enumerate(samples):
        for response in sample.responses:
            try:
                rows = sample.segments_of(response)
                for k, row in enumerate(rows):
                    _check(row, k)
            except SegmentError as exc:
                raise SegmentError(f"sample {sample.uid}, response {trajectory}: {exc}") from exc
            for k, row in enumerate(rows):
                yield TrainingRow(group=g, trajectory=trajectory, segment=k, reward=response.reward, row=row)
            trajectory += 1
