"""Schema 5: per-token fields as packed arrays. Round trips, the list-like API, old bytes, bad bytes, snapshots,
and the actor that keeps bytes without decoding them."""

from __future__ import annotations

import copy
import pickle
import random

import msgspec
import pytest

from arl.queue import (
    SCHEMA_VERSION,
    DecodeError,
    Float32Array,
    Int32Array,
    MessageQueue,
    MessageQueueActor,
    PackedArrayError,
    Response,
    Sample,
    SchemaVersionError,
    SegmentRow,
    UInt8Array,
    decode_sample,
    encode_sample,
    persistence,
    read_header,
    read_snapshot,
    response_from_segments,
    to_builtins,
    write_snapshot,
)
from arl.queue.errors import CorruptSnapshotError
from arl.queue.routed_experts import pack_routes, unpack_routes


def _segments(turns: int, rng: random.Random, routed: bool = False) -> list[SegmentRow]:
    """A rewritten history: each segment's prompt keeps most of the previous segment, with float32-exact log
    probs (multiples of 1/8) so lists and arrays hold the same values."""
    prompt = [rng.randrange(150_000) for _ in range(12)]
    segs = []
    for k in range(turns):
        sampled = [rng.randrange(150_000) for _ in range(7)]
        mask = [1] * 7 + [0]
        routes = (
            [[[rng.randrange(128), rng.randrange(128)]] * 3 if m else [] for m in mask] if routed else None
        )
        segs.append(
            SegmentRow(
                prompt_ids=prompt,
                response_ids=[*sampled, 13],
                response_mask=mask,
                response_logprobs=[-rng.randrange(64) / 8 for _ in range(7)] + [0.0],
                weight_versions=[k] * 7 + [-1],
                routed_experts=routes,
            )
        )
        prompt = prompt[:-2] + sampled + [13, 50 + k]  # drops two template tokens, adds a tool result
    return segs


def _sample(rng: random.Random, *, tokens: int = 40, n: int = 3, routed: bool = False) -> Sample:
    per = tokens // n
    responses = [
        Response(
            response_ids=[rng.randrange(150_000) for _ in range(per)],
            response_mask=[rng.randrange(2) for _ in range(per)],
            response_logprobs=[-rng.randrange(1000) / 64 for _ in range(per)],
            weight_versions=[rng.randrange(-1, 5) for _ in range(per)],
            reward=1.0,
            routed_experts=pack_routes([[[1, 2], [3, 4]]] * per) if routed else None,
        )
        for _ in range(n)
    ]
    responses.append(response_from_segments(_segments(3, rng, routed), group_prompt=[1, 2], reward=0.5))
    responses.append(
        Response(
            response_ids=[],
            response_mask=[],
            response_logprobs=[],
            weight_versions=[],
            reward=0.0,
            finish_reason="abort",
        )
    )
    return Sample(
        uid="u",
        prompt_ids=[rng.randrange(150_000) for _ in range(9)],
        responses=responses,
        start_version=1,
        end_version=4,
        metadata={"k": [1, 2]},
    )


@pytest.mark.parametrize("routed", [False, True])
def test_round_trip_with_segments_routes_and_empty_responses(routed):
    s = _sample(random.Random(0), routed=routed)
    back = decode_sample(encode_sample(s))
    assert back == s and back.schema_version == SCHEMA_VERSION == 5
    r = back.responses[-2]
    assert r.num_segments == 3 and back.segments_of(r) == s.segments_of(s.responses[-2])
    assert back.responses[-1].response_ids == [] and back.responses[-1].num_trained == 0
    for resp in back.responses:
        assert (
            type(resp.response_ids),
            type(resp.response_mask),
            type(resp.response_logprobs),
            type(resp.weight_versions),
        ) == (Int32Array, UInt8Array, Float32Array, Int32Array)
        for seg in resp.next_segments:
            assert type(seg.prompt_tail) is Int32Array and type(seg.response_logprobs) is Float32Array
    if (
        routed
    ):  # per-token routes of a later segment: sampled tokens routed, the tool token left to the trainer
        routes = unpack_routes(back.segments_of(r)[1].routed_experts)
        assert len(routes) == 8 and all(len(t) == 3 for t in routes[:7]) and routes[7] == []
    assert Sample(uid="e", prompt_ids=[], responses=[], start_version=0, end_version=0) == decode_sample(
        encode_sample(Sample(uid="e", prompt_ids=[], responses=[], start_version=0, end_version=0))
    )


def test_32k_tokens_round_trip_as_packed_bytes():
    rng = random.Random(1)
    n = 32_768
    r = Response(
        response_ids=[rng.randrange(2**31 - 1) for _ in range(n)],
        response_mask=[1] * n,
        response_logprobs=[-rng.random() * 9 for _ in range(n)],
        weight_versions=[7] * n,
        reward=1.0,
    )
    s = Sample(uid="big", prompt_ids=list(range(256)), responses=[r], start_version=7, end_version=7)
    data = encode_sample(s)
    # 4 + 1 + 4 + 4 bytes per token plus framing: packed, not a msgpack item per token.
    assert 13 * n + 4 * 256 <= len(data) < 13 * n + 4 * 256 + 400
    back = decode_sample(data)
    assert back == s and len(back.responses[0].response_ids) == n
    assert back.responses[0].response_ids[-1] == r.response_ids[-1] and back.min_token_version() == 7
    assert back.responses[0].response_logprobs == [
        float(x) for x in r.response_logprobs
    ]  # float32 both sides


def test_packed_arrays_read_like_lists():
    ids = Int32Array([5, 6, 7])
    assert ids == [5, 6, 7] and [5, 6, 7] == ids and ids != [5, 6] and (ids != [5, 6, 7]) is False
    assert ids == (5, 6, 7) and ids != "567" and ids != [5, 6, "x"]
    assert ids[1] == 6 and ids[-1] == 7 and ids[1:] == [6, 7] and type(ids[1:]) is Int32Array
    assert ids + [8] == [5, 6, 7, 8] and type(ids + [8]) is Int32Array
    assert [1] + ids == [1, 5, 6, 7] and type([1] + ids) is list
    assert ids * 2 == [5, 6, 7, 5, 6, 7] and list(ids) == [5, 6, 7] and sorted(ids, reverse=True) == [7, 6, 5]
    assert ids.index(6) == 1 and 7 in ids and sum(ids) == 18 and ids.tolist() == [5, 6, 7]
    for clone in (
        copy.copy(ids),
        copy.deepcopy(ids),
        pickle.loads(pickle.dumps(ids)),
        pickle.loads(pickle.dumps(ids, protocol=2)),
    ):
        assert type(clone) is Int32Array and clone == ids and clone is not ids
    assert repr(ids) == "Int32Array([5, 6, 7])"
    with pytest.raises(TypeError):
        hash(ids)
    # Log probs are float32: a list compares after the same rounding; items read back as float32 values.
    lp = Float32Array([-0.1, -2.5])
    assert lp == [-0.1, -2.5] and lp[1] == -2.5 and lp[0] != -0.1
    assert memoryview(lp).nbytes == 8 and UInt8Array([1, 0, 1]).count_nonzero() == 2


def test_constructor_packs_lists_and_names_a_bad_field():
    r = Response(
        response_ids=[1, 2],
        response_mask=[True, False],
        response_logprobs=[-1.0, 0.0],
        weight_versions=[3, -1],
        reward=0.0,
        prompt_ids=(4, 5),
    )
    assert type(r.prompt_ids) is Int32Array and r.response_mask == [1, 0] and r.num_trained == 1
    with pytest.raises(PackedArrayError, match="response_ids: cannot be stored as int32"):
        Response(
            response_ids=[2**31], response_mask=[1], response_logprobs=[0.0], weight_versions=[0], reward=0.0
        )
    with pytest.raises(PackedArrayError, match="response_mask: cannot be stored as uint8"):
        Response(
            response_ids=[1], response_mask=[-1], response_logprobs=[0.0], weight_versions=[0], reward=0.0
        )


def test_a_field_assigned_a_list_still_round_trips(sample):
    """Assignment after construction bypasses packing; the list travels as a msgpack list and decodes packed."""
    s = sample(1)
    s.responses[0].weight_versions = [4, 4, -1, 4]
    s.prompt_ids = [9, 8]
    back = decode_sample(encode_sample(s))
    assert back == s and type(back.responses[0].weight_versions) is Int32Array and back.prompt_ids == [9, 8]
    assert back.min_token_version() == 4


def test_encode_refuses_inconsistent_fields_by_name(sample):
    s = sample(1)
    s.responses[0].response_logprobs = s.responses[0].response_logprobs[:-1]
    with pytest.raises(
        PackedArrayError,
        match=r"sample s1: responses\[0\]\.response_logprobs has 3 items, "
        r"response_ids 4",
    ):
        encode_sample(s)
    s = sample(1)
    s.responses[0].response_mask[0] = 2
    with pytest.raises(
        PackedArrayError, match=r"responses\[0\]\.response_mask holds values other than 0 and 1"
    ):
        encode_sample(s)


def _raw(s: Sample) -> dict:
    """The msgpack map of `encode_sample(s)`, packed fields as bytes, to alter before re-encoding."""
    return msgspec.msgpack.decode(encode_sample(s))


@pytest.mark.parametrize(
    "alter, message",
    [
        (
            lambda raw: raw["responses"][0].__setitem__(
                "response_logprobs", raw["responses"][0]["response_logprobs"][:-2]
            ),
            r"not a whole number of float32 \(4-byte\) items \(truncated or corrupt\) - "
            r"at `\$\.responses\[0\]\.response_logprobs`",
        ),
        (
            lambda raw: raw.__setitem__("prompt_ids", raw["prompt_ids"][:-1]),
            r"not a whole number of int32 .* - at `\$\.prompt_ids`",
        ),
        (
            lambda raw: raw["responses"][1].__setitem__(
                "weight_versions", raw["responses"][1]["weight_versions"][:-4]
            ),
            r"responses\[1\]\.weight_versions has \d+ items, response_ids \d+",
        ),
        (
            lambda raw: raw["responses"][3]["next_segments"][0].__setitem__(
                3, b"\x07" * 8
            ),  # array_like: [3] = mask
            r"responses\[3\]\.next_segments\[0\]\.response_mask holds values other than 0 and 1",
        ),
        (
            lambda raw: raw["responses"][3]["next_segments"][1].__setitem__(
                1, b"\x01\x02\x03"
            ),  # [1] = prompt_tail
            r"not a whole number of int32 .* - at `\$\.responses\[3\]\.next_segments\[1\]\[1\]`",
        ),
        (
            lambda raw: raw["responses"][0]["routed_experts"].__setitem__(
                "data", raw["responses"][0]["routed_experts"]["data"][:-1]
            ),
            r"responses\[0\]\.routed_experts: \d+ bytes do not fill shape",
        ),
        (
            lambda raw: raw["responses"][0].__setitem__("response_ids", "a string"),
            r"expected int32 bytes, got str - at `\$\.responses\[0\]\.response_ids`",
        ),
    ],
)
def test_corrupt_packed_arrays_are_refused_naming_the_field(tmp_path, alter, message):
    s = _sample(random.Random(2), routed=True)
    raw = _raw(s)
    alter(raw)
    data = msgspec.msgpack.encode(raw)
    with pytest.raises(DecodeError, match=message) as info:
        decode_sample(data, where="producer P")
    assert "in producer P" in str(info.value) and not isinstance(info.value, SchemaVersionError)
    assert read_header(data) == SCHEMA_VERSION  # the header alone cannot tell: the consumer's decode does
    # In a snapshot (checksum intact: written so) it is refused whole, naming the file and the field.
    persistence.write_snapshot_bytes(
        tmp_path,
        msgspec.msgpack.encode(persistence._Snapshot(created_at=0.0, samples=[encode_sample(s), data])),
    )
    for read in (read_snapshot, persistence.read_snapshot_encoded):
        with pytest.raises(CorruptSnapshotError, match=r"sample 1 does not decode: .*" + message):
            read(tmp_path)
    with pytest.raises(CorruptSnapshotError):
        MessageQueue(4, persist_dir=tmp_path, encoded=True)


def test_schema_4_bytes_decode_to_equal_objects():
    """Schema 4 wrote every per-token field as a msgpack list (float64 log probs); those bytes still load."""
    s = _sample(random.Random(3), routed=True)
    raw = to_builtins(s)
    raw["schema_version"] = 4
    assert isinstance(raw["responses"][0]["response_ids"], list) and isinstance(raw["prompt_ids"], list)
    old = msgspec.msgpack.encode(raw)
    assert read_header(old) == 4
    back = decode_sample(old)
    assert back == s and back.schema_version == SCHEMA_VERSION
    assert type(back.responses[3].next_segments[0].prompt_tail) is Int32Array


async def test_snapshot_write_restore_decoded_and_encoded(tmp_path):
    samples = [_sample(random.Random(i), routed=i % 2 == 1) for i in range(3)]
    for i, s in enumerate(samples):
        s.uid = f"u{i}"
    q: MessageQueue[Sample] = MessageQueue(8, persist_dir=tmp_path / "a")
    for s in samples:
        await q.put(s)
    q.close()
    assert read_snapshot(tmp_path / "a") == samples
    # A queue of encoded samples writes its bytes as they are and restores them as bytes.
    e: MessageQueue[bytes] = MessageQueue(8, persist_dir=tmp_path / "b", encoded=True)
    for s in samples:
        e.put_nowait(encode_sample(s))
    e.close()
    assert read_snapshot(tmp_path / "b") == samples
    restored = MessageQueue.restore(tmp_path / "b", 8, encoded=True).drain_nowait()
    assert restored == [encode_sample(s) for s in samples]
    # A snapshot of schema-4 bytes restores into an encoded queue as current-schema bytes.
    old = []
    for s in samples:
        raw = to_builtins(s)
        raw["schema_version"] = 4
        old.append(msgspec.msgpack.encode(raw))
    write_snapshot(tmp_path / "c", old)
    upgraded = MessageQueue(8, persist_dir=tmp_path / "c", encoded=True).drain_nowait()
    assert [read_header(b) for b in upgraded] == [SCHEMA_VERSION] * 3
    assert [decode_sample(b) for b in upgraded] == samples


async def test_actor_keeps_the_bytes_it_was_given(tmp_path, sample):
    """The actor reads only the header: the consumer gets the producer's bytes, decoded once, by itself."""
    actor = MessageQueueActor(4, persist_dir=str(tmp_path))
    data = encode_sample(sample(1))
    assert await actor.put(data, 1.0)
    items, exhausted = await actor.get_batch(2, 0.01)
    assert items == [data] and not exhausted
    future = to_builtins(sample(2))
    future["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError):
        await actor.put(msgspec.msgpack.encode(future), 1.0)
    with pytest.raises(DecodeError, match="not an encoded Sample"):
        await actor.put_nowait(b"\xc1 not msgpack")
    with pytest.raises(DecodeError, match="no schema_version"):
        await actor.put_nowait(msgspec.msgpack.encode({"uid": "x"}))
    assert await actor.size() == 0
    await actor.put(data, 1.0)
    await actor.close()
    assert read_snapshot(tmp_path) == [sample(1)]
