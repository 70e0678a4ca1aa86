"""Encoding and decoding samples, including schema-version rejection."""

from __future__ import annotations

import msgspec
import pytest

from arl.queue import (
    SCHEMA_VERSION,
    DecodeError,
    SchemaVersionError,
    decode_sample,
    encode_sample,
    to_builtins,
)


def test_round_trip_is_exact(sample):
    s = sample(3)
    data = encode_sample(s)
    assert isinstance(data, bytes)
    back = decode_sample(data)
    assert back == s
    assert back.min_token_version() == 3


def test_wrong_schema_version_is_rejected(sample):
    s = sample(1)
    s.schema_version = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError, match=f"schema_version {SCHEMA_VERSION + 1}") as info:
        decode_sample(encode_sample(s))
    assert info.value.found == SCHEMA_VERSION + 1
    assert info.value.expected == SCHEMA_VERSION


def test_incompatible_future_schema_reports_version_not_shape(sample):
    # A future schema that also changed a field's type must still be reported as a version mismatch.
    raw = to_builtins(sample(1))
    raw["schema_version"] = SCHEMA_VERSION + 1
    raw["prompt_ids"] = "now a string"
    with pytest.raises(SchemaVersionError):
        decode_sample(msgspec.msgpack.encode(raw), where="producer X")


def test_non_integer_schema_version_is_a_decode_error(sample):
    raw = to_builtins(sample(1))
    raw["schema_version"] = "1"
    with pytest.raises(DecodeError, match="schema_version"):
        decode_sample(msgspec.msgpack.encode(raw))


def test_garbage_is_a_decode_error(sample):
    with pytest.raises(DecodeError) as info:
        decode_sample(b"\xc1 not msgpack")
    assert not isinstance(info.value, SchemaVersionError)
    raw = to_builtins(sample(1))
    raw["prompt_ids"] = "bad"
    with pytest.raises(DecodeError, match="not a valid Sample") as info:
        decode_sample(msgspec.msgpack.encode(raw))
    assert not isinstance(info.value, SchemaVersionError)


def test_errors_survive_pickling():
    import pickle
    from pathlib import Path

    from arl.queue import CorruptSnapshotError

    e = pickle.loads(pickle.dumps(SchemaVersionError(3, 1, "f.bin")))
    assert (e.found, e.expected, e.where) == (3, 1, "f.bin") and "f.bin" in str(e)
    c = pickle.loads(pickle.dumps(CorruptSnapshotError(Path("/x/queue.snapshot"), "bad")))
    assert c.path == Path("/x/queue.snapshot") and str(c) == "corrupt queue snapshot /x/queue.snapshot: bad"


def test_per_response_prompt_ids_round_trip(sample):
    from arl.queue import Response

    s = sample(2)
    s.responses.append(
        Response(
            response_ids=[9],
            response_mask=[1],
            response_logprobs=[-1.0],
            weight_versions=[2],
            reward=0.0,
            prompt_ids=[1, 2, 3, 4, 5],
        )
    )
    back = decode_sample(encode_sample(s))
    assert back.responses[0].prompt_ids is None and back.prompt_of(back.responses[0]) == [1, 2, 3]
    assert back.prompt_of(back.responses[1]) == [1, 2, 3, 4, 5]


def test_unreadable_old_schema_version_is_rejected(sample):
    raw = to_builtins(sample(1))
    raw["schema_version"] = 0
    with pytest.raises(SchemaVersionError):
        decode_sample(msgspec.msgpack.encode(raw))
