"""Trajectory segments on the queue: packing, the codec, snapshots, training rows, bad segments."""

from __future__ import annotations

import msgspec
import pytest

from arl.queue import (
    MessageQueue,
    PackedSegment,
    Response,
    Sample,
    SegmentError,
    SegmentRow,
    decode_sample,
    encode_sample,
    iter_segment_rows,
    pack_segments,
    read_snapshot,
    response_from_segments,
    to_builtins,
)
from arl.queue.packed import enc_hook


def rewritten_trajectory(turns: int = 4, base: int = 0) -> list[SegmentRow]:
    """Segments as a proxy records a session whose template drops a block of each earlier turn: segment
    k's prompt is segment k-1's tokens without its last 'think' tokens, plus a tool result and a
    generation prompt."""
    prompt = [base + 1, 2, 3, 4, 5, 6]
    segs = []
    for k in range(turns):
        think = [900 + k, 901 + k]  # template text the next turn drops
        sampled = [100 + 10 * k + j for j in range(5)]
        tail = [7]
        resp = sampled + tail
        segs.append(
            SegmentRow(
                prompt_ids=prompt + think,
                response_ids=resp,
                response_mask=[1] * 5 + [0],
                response_logprobs=[-0.1 * (j + 1) for j in range(5)] + [0.0],
                weight_versions=[k] * 5 + [-1],
            )
        )
        prompt = prompt + sampled + tail + [50 + k, 51, 52]  # tool result + generation prompt
    return segs


def sample_with(trajs: list[list[SegmentRow]], uid: str = "s") -> Sample:
    group = trajs[0][0].prompt_ids
    return Sample(
        uid=uid,
        prompt_ids=group,
        responses=[
            response_from_segments(t, group_prompt=group, reward=float(i)) for i, t in enumerate(trajs)
        ],
        start_version=0,
        end_version=3,
    )


def test_pack_round_trip_through_the_codec():
    traj = rewritten_trajectory()
    s = sample_with([traj, rewritten_trajectory(1)])
    back = decode_sample(encode_sample(s))
    assert back == s
    assert back.segments_of(back.responses[0]) == traj
    assert back.responses[0].num_segments == 4 and back.responses[1].num_segments == 1
    assert back.responses[0].num_trained == 20
    # The first segment is the response's own fields (readers of one sequence see it).
    r = back.responses[0]
    assert (s.prompt_ids + r.response_ids) == traj[0].prompt_ids + traj[0].response_ids
    # Packed: each later segment stores only the prompt past the previous segment's kept tokens.
    assert [p.shared_prefix for p in r.next_segments] == [6, 15, 24]
    assert r.next_segments[0].prompt_tail == [100, 101, 102, 103, 104, 7, 50, 51, 52, 901, 902]


def test_packing_is_compact():
    traj = rewritten_trajectory(turns=30)
    packed = len(encode_sample(sample_with([traj])))
    naive = len(msgspec.msgpack.encode(traj, enc_hook=enc_hook))  # each segment whole, packed the same way
    assert packed < naive / 3


def test_segments_survive_a_snapshot(tmp_path):
    async def run():
        q = MessageQueue(4, persist_dir=tmp_path)
        s = sample_with([rewritten_trajectory(), rewritten_trajectory(2)])
        await q.put(s)
        q.close()
        (restored,) = read_snapshot(tmp_path)
        assert restored == s
        assert restored.segments_of(restored.responses[1]) == rewritten_trajectory(2)

    import asyncio

    asyncio.run(run())


def test_missing_versions_become_minus_one():
    traj = rewritten_trajectory(2)
    proxy_like = [SegmentRow(**{**msgspec.structs.asdict(seg), "weight_versions": None}) for seg in traj]
    r = response_from_segments(proxy_like, group_prompt=traj[0].prompt_ids, reward=1.0)
    assert r.weight_versions == [-1] * 6 and r.next_segments[0].weight_versions == [-1] * 6
    s = Sample(uid="x", prompt_ids=traj[0].prompt_ids, responses=[r], start_version=0, end_version=0)
    assert [row.prompt_ids for row in s.segments_of(r)] == [seg.prompt_ids for seg in traj]


def test_own_first_prompt():
    """A trajectory whose first prompt differs from its group's carries it (Response.prompt_ids)."""
    traj = rewritten_trajectory(2)
    r = response_from_segments(traj, group_prompt=[1, 2], reward=1.0)
    assert r.prompt_ids == traj[0].prompt_ids
    s = decode_sample(
        encode_sample(Sample(uid="x", prompt_ids=[1, 2], responses=[r], start_version=0, end_version=0))
    )
    assert s.segments_of(s.responses[0]) == traj
    same = response_from_segments(traj, group_prompt=traj[0].prompt_ids, reward=1.0)
    assert same.prompt_ids is None


def test_min_token_version_sees_every_segment():
    s = sample_with([rewritten_trajectory()])
    s.responses[0].weight_versions = [-1] * len(s.responses[0].weight_versions)
    assert s.min_token_version() == 1


def test_training_rows_index_trajectories_and_groups():
    a = sample_with([rewritten_trajectory(3), rewritten_trajectory(1)], uid="a")
    b = sample_with([rewritten_trajectory(2)], uid="b")
    rows = list(iter_segment_rows([a, b]))
    assert [(r.group, r.trajectory, r.segment, r.reward) for r in rows] == [
        (0, 0, 0, 0.0),
        (0, 0, 1, 0.0),
        (0, 0, 2, 0.0),
        (0, 1, 0, 1.0),
        (1, 2, 0, 0.0),
        (1, 2, 1, 0.0),
    ]
    # Every sampled token once, with its log prob, over the rows.
    trained = [
        (t, lp)
        for r in rows[:3]
        for t, m, lp in zip(r.row.response_ids, r.row.response_mask, r.row.response_logprobs)
        if m
    ]
    assert [t for t, _ in trained] == [100 + 10 * k + j for k in range(3) for j in range(5)]


def test_bad_segments_are_named():
    traj = rewritten_trajectory(2)
    bad = [traj[0], SegmentRow(**{**msgspec.structs.asdict(traj[1]), "response_mask": [1]})]
    with pytest.raises(SegmentError, match="segment 1: response fields differ in length"):
        pack_segments(bad)
    with pytest.raises(SegmentError, match="at least one segment"):
        pack_segments([])
    s = sample_with([traj])
    s.responses[0].next_segments[0] = PackedSegment(
        shared_prefix=999,
        prompt_tail=[],
        response_ids=[],
        response_mask=[],
        response_logprobs=[],
        weight_versions=[],
    )
    with pytest.raises(SegmentError, match="segment 1 shares 999 tokens"):
        s.segments_of(s.responses[0])


def test_single_segment_response_encodes_as_before(sample):
    """A response without further segments lays out as the one row it always was."""
    s = sample(1)
    assert s.responses[0].next_segments == [] and s.responses[0].num_segments == 1
    assert s.segments_of(s.responses[0]) == [
        SegmentRow(
            prompt_ids=[1, 2, 3],
            response_ids=[0, 1, 2, 3],
            response_mask=[1] * 4,
            response_logprobs=[-0.5] * 4,
            weight_versions=[1] * 4,
        )
    ]
    assert isinstance(s.responses[0], Response)


def _older(sample: Sample, version: int) -> bytes:
    """`sample` encoded as schema `version` wrote it: per-token fields as lists; before v4 no
    next_segments; in v1 routing as nested lists."""
    raw = to_builtins(sample)
    raw["schema_version"] = version
    for r in raw["responses"]:
        if version < 4:
            r.pop("next_segments")
        if version < 3:
            r.pop("prompt_ids")
        if version == 1:
            r["routed_experts"] = [[[1, 2], [3, 4]]] * len(r["response_ids"])
    return msgspec.msgpack.encode(raw)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_older_schemas_still_load(tmp_path, sample, version):
    from arl.queue import SCHEMA_VERSION, persistence
    from arl.queue.routed_experts import unpack_routes

    s = sample(3)
    back = decode_sample(_older(s, version))
    assert back.schema_version == SCHEMA_VERSION == 5
    assert back.responses[0].next_segments == [] and back.responses[0].num_segments == 1
    assert back.responses[0].response_ids == s.responses[0].response_ids
    if version == 1:
        assert unpack_routes(back.responses[0].routed_experts) == [[[1, 2], [3, 4]]] * 4
    # A snapshot written by the older code (its samples as that version's bytes) restores.
    payload = msgspec.msgpack.encode(persistence._Snapshot(created_at=0.0, samples=[_older(s, version)]))
    persistence.write_snapshot_bytes(tmp_path, payload)
    (restored,) = read_snapshot(tmp_path)
    assert restored.segments_of(restored.responses[0]) == back.segments_of(back.responses[0])


def test_segment_routing_is_packed():
    from arl.queue.routed_experts import unpack_routes

    traj = rewritten_trajectory(2)
    routed = [
        SegmentRow(
            **{
                **msgspec.structs.asdict(seg),
                "routed_experts": [[[k, k + 1]] if m else [] for k, m in enumerate(seg.response_mask)],
            }
        )
        for seg in traj
    ]
    r = response_from_segments(routed, reward=0.0)
    s = decode_sample(
        encode_sample(
            Sample(uid="r", prompt_ids=traj[0].prompt_ids, responses=[r], start_version=0, end_version=0)
        )
    )
    rows = s.segments_of(s.responses[0])
    assert unpack_routes(rows[1].routed_experts)[:2] == [[[0, 1]], [[1, 2]]]
