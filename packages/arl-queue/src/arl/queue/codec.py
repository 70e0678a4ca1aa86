"""Encoding a `Sample` to msgpack bytes and back, with a schema-version check on the way in."""

from __future__ import annotations

import msgspec
from arl.queue.errors import DecodeError, SchemaVersionError
from arl.queue.types import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, Sample


class _Header(msgspec.Struct):
    """The one field every schema version keeps: read first when a full decode fails."""

    schema_version: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Sample)
_header_decoder = msgspec.msgpack.Decoder(_Header)


def encode_sample(sample: Sample) -> bytes:
    """Encode `sample` as msgpack bytes (its `schema_version` travels with it)."""
    return _encoder.encode(sample)


def decode_sample(data: bytes | bytearray | memoryview, *, where: str = "") -> Sample:
    """Decode msgpack bytes made by `encode_sample`.

    Bytes of an older readable schema (`READABLE_SCHEMA_VERSIONS`) decode to a current `Sample`.
    Raises `SchemaVersionError` when the bytes carry an unreadable schema version (checked before the shape,
    so a future incompatible schema is reported as such), and `DecodeError` when they are not a sample. `where` names the source in error messages.
    """
    try:
        sample = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        found = _read_version(data)
        if found is not None and found not in READABLE_SCHEMA_VERSIONS:
            raise SchemaVersionError(found, SCHEMA_VERSION, where) from exc
        suffix = f" in {where}" if where else ""
        raise DecodeError(f"bytes{suffix} are not a valid Sample: {exc}") from exc
    if sample.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise SchemaVersionError(sample.schema_version, SCHEMA_VERSION, where)
    if sample.schema_version != SCHEMA_VERSION:  # an older schema: its new fields took their defaults
        sample.schema_version = SCHEMA_VERSION
    return sample


def _read_version(data: bytes | bytearray | memoryview) -> int | None:
    """The schema_version field of an encoded map, or None when it has none or is not a msgpack map."""
    try:
        return _header_decoder.decode(data).schema_version
    except msgspec.DecodeError:
        return None
