"""Bucket planning: lay named tensors out in one aligned byte stream, cut it into fixed-size buckets.

Every tensor starts at a multiple of `align_bytes`; bucket k is stream bytes [k*B, (k+1)*B). A tensor
that crosses a bucket boundary is split into chunks there, and since B is a multiple of the alignment,
every chunk holds whole elements. The receiver's staging buffer has the same layout as the stream,
so a bucket lands with one copy and tensors are views of it. Planning is lazy: the iterator is drawn
only as far as the bucket being filled.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from .errors import SyncConfigError
from .types import TensorMeta

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    )
}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype ("bfloat16")."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a wire name; raises `SyncConfigError` for an unknown one."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise SyncConfigError(f"unsupported dtype {name!r}") from None


def align_up(x: int, align: int) -> int:
    return (x + align - 1) & ~(align - 1)


@dataclass(slots=True)
class Chunk:
    """Elements [start, stop) of `flat` go to bucket bytes [lo, hi)."""

    flat: torch.Tensor
    start: int
    stop: int
    lo: int
    hi: int
    out_dtype: torch.dtype


@dataclass(slots=True)
class PlannedBucket:
    """One bucket: its chunks, its byte count, and the tensors that start in it."""

    index: int
    nbytes: int
    chunks: list[Chunk] = field(default_factory=list)
    tensors: list[TensorMeta] = field(default_factory=list)


@dataclass(slots=True)
class PlanTotals:
    """Filled in while the plan is drawn; final once the iterator is exhausted."""

    tensors: int = 0
    payload_bytes: int = 0
    stream_bytes: int = 0
    buckets: int = 0


def validate(bucket_bytes: int, align_bytes: int) -> None:
    if align_bytes < 16 or align_bytes & (align_bytes - 1):
        raise SyncConfigError(f"align_bytes must be a power of two >= 16, got {align_bytes}")
    if bucket_bytes <= 0 or bucket_bytes % align_bytes:
        raise SyncConfigError(
            f"bucket_bytes must be a positive multiple of align_bytes ({align_bytes}), got {bucket_bytes}"
        )


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    align_bytes: int,
    cast_dtype: torch.dtype | None = None,
    totals: PlanTotals | None = None,
) -> Iterator[PlannedBucket]:
    """Yield the buckets of `named_tensors`, each as soon as it is full (the last may be partial).

    Floating-point tensors are cast to `cast_dtype` if given (the cast happens when a chunk is packed).
    """
    validate(bucket_bytes, align_bytes)
    totals = totals if totals is not None else PlanTotals()
    B = bucket_bytes
    pos = 0
    cur = PlannedBucket(index=0, nbytes=0)
    seen: set[str] = set()
    for name, tensor in named_tensors:
        if not isinstance(tensor, torch.Tensor):
            raise SyncConfigError(f"{name!r} is not a torch.Tensor")
        if name in seen:
            raise SyncConfigError(f"tensor name {name!r} appears twice")
        seen.add(name)
        out_dtype = tensor.dtype
        if cast_dtype is not None and tensor.dtype.is_floating_point:
            out_dtype = cast_dtype
        flat = tensor.detach().contiguous().view(-1)
        itemsize = out_dtype.itemsize
        off = align_up(pos, align_bytes)
        nbytes = flat.numel() * itemsize
        while off >= (cur.index + 1) * B:  # padding pushed the start into a later bucket
            cur.nbytes = B
            yield cur
            cur = PlannedBucket(index=cur.index + 1, nbytes=0)
        cur.tensors.append(
            TensorMeta(name=name, dtype=dtype_name(out_dtype), shape=list(tensor.shape), offset=off, nbytes=nbytes)
        )
        totals.tensors += 1
        totals.payload_bytes += nbytes
        start = off
        end = off + nbytes
        while start < end:
            bucket_end = (cur.index + 1) * B
            stop = min(end, bucket_end)
            base = cur.index * B
            cur.chunks.append(
                Chunk(flat, (start - off) // itemsize, (stop - off) // itemsize, start - base, stop - base, out_dtype)
            )
            start = stop
            if stop == bucket_end:
                cur.nbytes = B
                yield cur
                cur = PlannedBucket(index=cur.index + 1, nbytes=0)
        pos = end
    last = pos - cur.index * B
    if last > 0 or cur.tensors:
        cur.nbytes = max(last, 0)
        yield cur
        totals.buckets = cur.index + 1
    else:
        totals.buckets = cur.index
    totals.stream_bytes = pos


def pack_chunks(buf: torch.Tensor, chunks: list[Chunk], non_blocking: bool = False) -> None:
    """Copy (and cast) each chunk into the uint8 buffer `buf` at its bucket-relative bytes."""
    for c in chunks:
        dst = buf[c.lo : c.hi].view(c.out_dtype)
        dst.copy_(c.flat[c.start : c.stop], non_blocking=non_blocking)


def stream_views(staging: torch.Tensor, metas: Iterable[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views of a staged stream (uint8 tensor laid out like the stream)."""
    for m in metas:
        dtype = dtype_from_name(m.dtype)
        t = staging[m.offset : m.offset + m.nbytes].view(dtype).view(m.shape)
        yield m.name, t
