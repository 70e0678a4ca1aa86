"""Persisting queued samples to a directory for lossless resume, and reading them back.

A snapshot is one file, `queue.snapshot`, written atomically (temporary file, fsync, rename): a magic
header, the SHA-256 of the payload, then the payload, a msgpack `_Snapshot` holding each sample as
`codec.encode_sample` bytes. A reader therefore sees either the previous snapshot or the new one, never
a mix, and any truncation or bit flip is reported as `CorruptSnapshotError` naming the file.

A queue may hold samples decoded (`Sample`) or encoded (bytes, as the Ray actor keeps them): encoded
ones are written as they are, and `read_snapshot_encoded` gives them back as current-schema bytes after
decoding each once (so a bad snapshot is refused whole at restore, never half-loaded).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from arl.queue.codec import decode_sample, encode_sample, read_header
from arl.queue.errors import CorruptSnapshotError, DecodeError, SchemaVersionError
from arl.queue.types import SCHEMA_VERSION, Sample

SNAPSHOT_FILENAME = "queue.snapshot"
_MAGIC = b"ARLQSNP1"
_DIGEST_SIZE = 32


class _Snapshot(msgspec.Struct, kw_only=True):
    """The payload of a snapshot file."""

    created_at: float
    samples: list[bytes]


def snapshot_path(directory: str | os.PathLike[str]) -> Path:
    """The snapshot file inside `directory`."""
    return Path(directory) / SNAPSHOT_FILENAME


def write_snapshot(directory: str | os.PathLike[str], samples: Iterable[Sample | bytes]) -> Path:
    """Atomically replace the snapshot in `directory` (created if missing) with `samples` (decoded, or
    encoded bytes kept as they are), in order."""
    return write_snapshot_bytes(directory, encode_snapshot(samples))


def write_snapshot_bytes(directory: str | os.PathLike[str], payload: bytes) -> Path:
    """Write an already encoded snapshot payload (see `encode_snapshot`) atomically; returns the file."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / SNAPSHOT_FILENAME
    fd, tmp_name = tempfile.mkstemp(prefix=f".{SNAPSHOT_FILENAME}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC)
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return target


def encode_snapshot(samples: Iterable[Sample | bytes]) -> bytes:
    """Encode `samples` (decoded, or already encoded bytes) as a snapshot payload (cheap; do it where the
    samples are consistent)."""
    encoded = [
        bytes(s) if isinstance(s, (bytes, bytearray, memoryview)) else encode_sample(s) for s in samples
    ]
    return msgspec.msgpack.encode(_Snapshot(created_at=time.time(), samples=encoded))


def read_snapshot(directory: str | os.PathLike[str]) -> list[Sample]:
    """The samples of the snapshot in `directory`, in queue order; [] when there is no snapshot.

    Raises `CorruptSnapshotError` (naming the file) when the file is not an intact snapshot, and
    `SchemaVersionError` when it holds samples of another schema version.
    """
    return [sample for _, sample in _read(directory)]


def read_snapshot_encoded(directory: str | os.PathLike[str]) -> list[bytes]:
    """Like `read_snapshot`, but each sample as current-schema `encode_sample` bytes (for a queue that
    keeps samples encoded). Every sample is decoded once here, so what comes back is known good."""
    out = []
    for data, sample in _read(directory):
        out.append(data if read_header(data) == SCHEMA_VERSION else encode_sample(sample))
    return out


def _read(directory: str | os.PathLike[str]) -> list[tuple[bytes, Sample]]:
    """(stored bytes, decoded sample) of each sample of the snapshot in `directory`."""
    path = snapshot_path(directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    header = len(_MAGIC) + _DIGEST_SIZE
    if len(raw) < header or raw[: len(_MAGIC)] != _MAGIC:
        raise CorruptSnapshotError(path, "not an arl-queue snapshot (bad or missing header)")
    digest, payload = raw[len(_MAGIC) : header], raw[header:]
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptSnapshotError(path, "checksum mismatch (file truncated or altered)")
    try:
        snap = msgspec.msgpack.decode(payload, type=_Snapshot)
    except msgspec.DecodeError as exc:
        raise CorruptSnapshotError(path, f"payload does not decode: {exc}") from exc
    samples = []
    for i, data in enumerate(snap.samples):
        try:
            samples.append((data, decode_sample(data, where=f"{path} (sample {i})")))
        except SchemaVersionError:
            raise
        except DecodeError as exc:
            raise CorruptSnapshotError(path, f"sample {i} does not decode: {exc}") from exc
    return samples


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (best effort on platforms without directory fds)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
