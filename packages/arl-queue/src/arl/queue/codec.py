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
    Raises `SchemaVersionError` when the bytes carry an unreadable schema version (checked before the
    shape, so a future incompatible schema is reported as such), and `DecodeError` when they are not a
    sample. `where` names the source in error messages.
    """
    suffix = f" in {where}" if where else ""
    try:
        sample = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        found = _read_version(data)
        if found is not None and found not in READABLE_SCHEMA_VERSIONS:
            raise SchemaVersionError(found, SCHEMA_VERSION, where) from exc
        if found is not None and found < SCHEMA_VERSION:
            return _upgrade(data, found, suffix)
        raise DecodeError(f"bytes{suffix} are not a valid Sample: {exc}") from exc
    if sample.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise SchemaVersionError(sample.schema_version, SCHEMA_VERSION, where)
    sample.schema_version = SCHEMA_VERSION  # an older schema whose new fields took their defaults
    return sample


def _upgrade(data: bytes | bytearray | memoryview, found: int, suffix: str) -> Sample:
    """An older encoding that the current types cannot read as is: convert it field by field."""
    from arl.queue.routed_experts import pack_routes

    try:
        raw = msgspec.msgpack.decode(data)
        if found < 2:  # routing was nested lists per token
            for r in raw.get("responses", []):
                if isinstance(r.get("routed_experts"), list):
                    r["routed_experts"] = msgspec.to_builtins(pack_routes(r["routed_experts"]))
        raw["schema_version"] = SCHEMA_VERSION
        return msgspec.convert(raw, Sample)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise DecodeError(f"bytes{suffix} are not a valid schema-{found} Sample: {exc}") from exc


def _read_version(data: bytes | bytearray | memoryview) -> int | None:
    """The schema_version field of an encoded map, or None when it has none or is not a msgpack map."""
    try:
        return _header_decoder.decode(data).schema_version
    except msgspec.DecodeError:
        return None
