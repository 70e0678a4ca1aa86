"""Encoding a `Sample` to msgpack bytes and back, with a schema-version check on the way in.

Per-token fields travel as packed little-endian arrays (`arl.queue.packed`), so decoding a sample is a
few memory copies, not one Python object per token. Both directions check what the schema promises but
msgpack cannot: the per-token fields of a response (and of each segment) have one length, masks hold
only 0/1, packed routing fills its shape. `read_header` reads only `schema_version`, for a hop (the
queue actor) that stores the bytes without decoding them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from arl.queue.errors import DecodeError, PackedArrayError, SchemaVersionError
from arl.queue.packed import UInt8Array, builtins_hook, dec_hook, enc_hook
from arl.queue.types import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, RoutedExperts, Sample

_ROUTE_ITEMSIZE = {"uint8": 1, "uint16": 2}


class _Header(msgspec.Struct):
    """The one field every schema version keeps: read first when a full decode fails."""

    schema_version: int | None = None


_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_decoder = msgspec.msgpack.Decoder(Sample, dec_hook=dec_hook)
_header_decoder = msgspec.msgpack.Decoder(_Header)


def encode_sample(sample: Sample) -> bytes:
    """Encode `sample` as msgpack bytes (its `schema_version` travels with it).

    Raises `PackedArrayError` (naming the sample and field) when a response's per-token fields differ
    in length or a mask holds something other than 0/1: such a sample is refused where it is made.
    """
    check_sample(sample)
    return _encoder.encode(sample)


def decode_sample(data: bytes | bytearray | memoryview, *, where: str = "") -> Sample:
    """Decode msgpack bytes made by `encode_sample`.

    Bytes of an older readable schema (`READABLE_SCHEMA_VERSIONS`) decode to a current `Sample`.
    Raises `SchemaVersionError` when the bytes carry an unreadable schema version (checked before the
    shape, so a future incompatible schema is reported as such), and `DecodeError` when they are not a
    sample (naming the field, e.g. a truncated packed array). `where` names the source in error messages.
    """
    suffix = f" in {where}" if where else ""
    try:
        sample = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        found = _read_version(data)
        if found is not None and found not in READABLE_SCHEMA_VERSIONS:
            raise SchemaVersionError(found, SCHEMA_VERSION, where) from exc
        if found is not None and found < 2:
            return _upgrade(data, found, suffix)
        raise DecodeError(f"bytes{suffix} are not a valid Sample: {exc}") from exc
    if sample.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise SchemaVersionError(sample.schema_version, SCHEMA_VERSION, where)
    _checked(sample, suffix)
    sample.schema_version = SCHEMA_VERSION  # an older schema whose new fields took their defaults
    return sample


def read_header(data: bytes | bytearray | memoryview, *, where: str = "") -> int:
    """The `schema_version` of encoded sample bytes, checked readable, without decoding the rest.

    Raises `SchemaVersionError` for an unreadable version and `DecodeError` for bytes that are not a
    msgpack map with an integer `schema_version`. Cheap: packed arrays are skipped, not parsed.
    """
    suffix = f" in {where}" if where else ""
    try:
        found = _header_decoder.decode(data).schema_version
    except msgspec.DecodeError as exc:
        raise DecodeError(f"bytes{suffix} are not an encoded Sample: {exc}") from exc
    if found is None:
        raise DecodeError(f"bytes{suffix} are not an encoded Sample: no schema_version")
    if found not in READABLE_SCHEMA_VERSIONS:
        raise SchemaVersionError(found, SCHEMA_VERSION, where)
    return found


def to_builtins(sample: Sample) -> dict[str, Any]:
    """`sample` as plain Python builtins: dicts, lists of ints/floats (the per-token fields), bytes
    (packed routing). Encoded with plain msgpack this is exactly what schema 4 wrote."""
    return msgspec.to_builtins(sample, enc_hook=builtins_hook, builtin_types=(bytes,))


def check_sample(sample: Sample) -> None:
    """Raise `PackedArrayError` naming the first inconsistent per-token field of `sample`."""
    for i, r in enumerate(sample.responses):
        _check_tokens(r, f"sample {sample.uid}: responses[{i}]")
        for k, seg in enumerate(r.next_segments):
            if seg.shared_prefix < 0:
                raise PackedArrayError(
                    f"sample {sample.uid}: responses[{i}].next_segments[{k}].shared_prefix "
                    f"is {seg.shared_prefix}"
                )
            _check_tokens(seg, f"sample {sample.uid}: responses[{i}].next_segments[{k}]")


def _check_tokens(fields: Any, where: str) -> None:
    n = len(fields.response_ids)
    for name in ("response_mask", "response_logprobs", "weight_versions"):
        if len(getattr(fields, name)) != n:
            raise PackedArrayError(f"{where}.{name} has {len(getattr(fields, name))} items, response_ids {n}")
    mask = fields.response_mask
    if isinstance(mask, UInt8Array) and not mask.only_zero_one():
        raise PackedArrayError(f"{where}.response_mask holds values other than 0 and 1")
    routes = fields.routed_experts
    if routes is not None:
        _check_routes(routes, f"{where}.routed_experts")


def _check_routes(routes: RoutedExperts, where: str) -> None:
    itemsize = _ROUTE_ITEMSIZE.get(routes.dtype)
    if itemsize is None:
        raise PackedArrayError(f"{where}: unknown dtype {routes.dtype!r}")
    tokens, layers, top_k = routes.shape
    if min(routes.shape) < 0 or len(routes.data) != tokens * layers * top_k * itemsize:
        raise PackedArrayError(
            f"{where}: {len(routes.data)} bytes do not fill shape {tuple(routes.shape)} "
            f"of {routes.dtype} (truncated or corrupt)"
        )


def _checked(sample: Sample, suffix: str) -> Sample:
    try:
        check_sample(sample)
    except PackedArrayError as exc:
        raise DecodeError(f"bytes{suffix} are not a valid Sample: {exc}") from exc
    return sample


def _upgrade(data: bytes | bytearray | memoryview, found: int, suffix: str) -> Sample:
    """An older encoding that the current types cannot read as is: convert it field by field.

    Schemas 2–4 decode directly (their lists are packed by `packed.dec_hook`); schema 1 carried routing
    as nested lists per token."""
    from arl.queue.routed_experts import pack_routes

    try:
        raw = msgspec.msgpack.decode(data)
        for r in raw.get("responses", []):
            if isinstance(r.get("routed_experts"), list):
                r["routed_experts"] = msgspec.to_builtins(pack_routes(r["routed_experts"]))
        raw["schema_version"] = SCHEMA_VERSION
        sample = msgspec.convert(raw, Sample, dec_hook=dec_hook)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise DecodeError(f"bytes{suffix} are not a valid schema-{found} Sample: {exc}") from exc
    return _checked(sample, suffix)


def _read_version(data: bytes | bytearray | memoryview) -> int | None:
    """The schema_version field of an encoded map, or None when it has none or is not a msgpack map."""
    try:
        return _header_decoder.decode(data).schema_version
    except msgspec.DecodeError:
        return None
