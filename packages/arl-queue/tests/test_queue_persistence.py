"""Snapshots for lossless resume: round trip, atomic replace, corruption and version errors."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from arl.queue import (
    SCHEMA_VERSION,
    SNAPSHOT_FILENAME,
    CorruptSnapshotError,
    MessageQueue,
    SchemaVersionError,
    persistence,
    read_snapshot,
    write_snapshot,
)


async def test_snapshot_round_trip(tmp_path, sample):
    q = MessageQueue(10, persist_dir=tmp_path)
    for i in range(4):
        await q.put(sample(i))
    await q.get()
    path = q.snapshot()
    assert path == tmp_path / SNAPSHOT_FILENAME and path.exists()
    assert [p.name for p in tmp_path.iterdir()] == [SNAPSHOT_FILENAME]  # no temp files left

    q2 = MessageQueue.restore(tmp_path, 10)
    assert q2.size() == 3 and q2.stats().restored == 3
    restored = await q2.get_batch(3, timeout=0)
    assert restored == [sample(1), sample(2), sample(3)]


async def test_close_snapshots_and_constructor_restores(tmp_path, sample):
    q = MessageQueue(5, persist_dir=tmp_path)
    for i in range(3):
        await q.put(sample(i))
    q.close()
    again = MessageQueue(5, persist_dir=tmp_path)
    assert [s.uid for s in again.drain_nowait()] == ["s0", "s1", "s2"]
    fresh = MessageQueue(5, persist_dir=tmp_path, restore=False)
    assert fresh.size() == 0


async def test_close_without_snapshot_keeps_previous_file(tmp_path, sample):
    q = MessageQueue(5, persist_dir=tmp_path)
    await q.put(sample(0))
    q.snapshot()
    await q.put(sample(1))
    q.close(snapshot=False)
    assert [s.uid for s in read_snapshot(tmp_path)] == ["s0"]


async def test_snapshot_async_and_empty_snapshot(tmp_path, sample):
    q = MessageQueue(5, persist_dir=tmp_path)
    await q.put(sample(0))
    await q.snapshot_async()
    assert [s.uid for s in read_snapshot(tmp_path)] == ["s0"]
    q.drain_nowait()
    await q.snapshot_async()
    assert read_snapshot(tmp_path) == []


async def test_restore_beyond_capacity_keeps_everything(tmp_path, sample):
    write_snapshot(tmp_path, [sample(i) for i in range(5)])
    q = MessageQueue(2, persist_dir=tmp_path)
    assert q.size() == 5 and q.full()
    assert await q.put(sample(9), timeout=0.01) is False
    await q.get_batch(4, timeout=0)
    assert await q.put(sample(9), timeout=0) is True


def test_no_snapshot_means_empty(tmp_path):
    assert read_snapshot(tmp_path / "missing") == []
    assert MessageQueue(3, persist_dir=tmp_path / "missing").size() == 0


def test_snapshot_needs_a_dir():
    with pytest.raises(ValueError):
        MessageQueue(3).snapshot()


def _snapshot_file(tmp_path, sample):
    return write_snapshot(tmp_path, [sample(0), sample(1)])


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda raw: raw[: len(raw) // 2], "checksum"),
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 0x01]), "checksum"),
        (lambda raw: b"garbage", "header"),
        (lambda raw: b"", "header"),
        (lambda raw: b"NOTMAGIC" + raw[8:], "header"),
    ],
    ids=["truncated", "bitflip", "garbage", "empty", "bad-magic"],
)
def test_corrupted_file_raises_naming_the_file(tmp_path, sample, mutate, reason):
    path = _snapshot_file(tmp_path, sample)
    path.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(CorruptSnapshotError, match=reason) as info:
        MessageQueue(5, persist_dir=tmp_path)
    assert str(path) in str(info.value)
    assert info.value.path == path


def test_valid_checksum_but_bad_payload_is_corrupt(tmp_path):
    import hashlib

    payload = msgspec.msgpack.encode({"created_at": 0.0, "samples": [b"\x01\x02"]})
    path = tmp_path / SNAPSHOT_FILENAME
    path.write_bytes(persistence._MAGIC + hashlib.sha256(payload).digest() + payload)
    with pytest.raises(CorruptSnapshotError, match="sample 0") as info:
        read_snapshot(tmp_path)
    assert str(path) in str(info.value)


def test_snapshot_of_other_schema_version_is_rejected(tmp_path, sample):
    s = sample(0)
    s.schema_version = SCHEMA_VERSION + 1
    path = write_snapshot(tmp_path, [s])
    with pytest.raises(SchemaVersionError) as info:
        MessageQueue.restore(tmp_path, 5)
    assert str(path) in str(info.value)


def test_failed_write_leaves_previous_snapshot(tmp_path, sample, monkeypatch):
    write_snapshot(tmp_path, [sample(0)])

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(persistence.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_snapshot(tmp_path, [sample(1), sample(2)])
    monkeypatch.undo()
    assert [s.uid for s in read_snapshot(tmp_path)] == ["s0"]
    assert [p.name for p in tmp_path.iterdir()] == [SNAPSHOT_FILENAME]


def _v1_sample_bytes(i: int) -> bytes:
    """A sample exactly as schema 1 encoded it: no `Response.prompt_ids`, schema_version 1."""
    return msgspec.msgpack.encode(
        {
            "uid": f"old{i}",
            "prompt_ids": [7, 8],
            "responses": [
                {
                    "response_ids": [1, 2],
                    "response_mask": [1, 1],
                    "response_logprobs": [-0.1, -0.2],
                    "weight_versions": [3, 3],
                    "reward": 1.0,
                    "finish_reason": "stop",
                    "num_turns": 1,
                    "rewards": {},
                    "routed_experts": None,
                }
            ],
            "start_version": 3,
            "end_version": 4,
            "task_id": "t",
            "metadata": {},
            "timings": {},
            "schema_version": 1,
        }
    )


def test_schema_1_snapshot_still_loads(tmp_path):
    payload = msgspec.msgpack.encode(
        {"created_at": 0.0, "samples": [_v1_sample_bytes(0), _v1_sample_bytes(1)]}
    )
    (tmp_path / SNAPSHOT_FILENAME).write_bytes(
        persistence._MAGIC + hashlib.sha256(payload).digest() + payload
    )
    restored = read_snapshot(tmp_path)
    assert [s.uid for s in restored] == ["old0", "old1"]
    for s in restored:
        assert s.schema_version == SCHEMA_VERSION
        assert s.responses[0].prompt_ids is None
        assert s.prompt_of(s.responses[0]) == [7, 8]
    q = MessageQueue.restore(tmp_path, 5)
    assert q.stats().restored == 2
