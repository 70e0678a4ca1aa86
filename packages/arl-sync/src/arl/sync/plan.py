"""Bucket planning: lay named tensors out in one aligned byte stream, cut it into fixed-size buckets.

Every tensor starts at a multiple of `align_bytes`; bucket k is stream bytes [k*B, (k+1)*B). A tensor
that crosses a bucket boundary is split into chunks there, and since B is a multiple of the alignment,
every chunk holds whole elements. The receiver's staging buffer has the same layout as the stream,
so a bucket lands with one copy and tensors are views of it. Planning is lazy: the iterator is drawn
only as far as the bucket being filled.

A plan depends only on the tensors' names, shapes and dtypes, which a trainer repeats at every sync:
`PlanMemo` keeps one and re-points its chunks at the next sync's tensors instead of planning again
(the sender's per-tensor host work is what bounds a same-GPU transfer).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .errors import SyncConfigError
from .types import TensorMeta

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
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
    """Elements [start, stop) of `flat` (tensor number `tensor` of the stream, flattened) go to bucket
    bytes [lo, hi)."""

    flat: torch.Tensor
    start: int
    stop: int
    lo: int
    hi: int
    out_dtype: torch.dtype
    tensor: int = 0


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
    for number, (name, tensor) in enumerate(named_tensors):
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
            TensorMeta(
                name=name, dtype=dtype_name(out_dtype), shape=list(tensor.shape), offset=off, nbytes=nbytes
            )
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
                Chunk(
                    flat,
                    (start - off) // itemsize,
                    (stop - off) // itemsize,
                    start - base,
                    stop - base,
                    out_dtype,
                    number,
                )
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


# Chunks smaller than this are copied together in one batched launch (`torch._foreach_copy_`): a
# model's biases and norms are about half its tensors, and a launch each would leave the GPU idle
# between them (7B: 339 tensors, 141 of them under 1 MiB). Larger chunks keep a copy each, which
# moves bytes faster than the batched kernel does.
SMALL_CHUNK_BYTES = 1 << 20


_NO_SOURCE = torch.empty(0)


def _signature(named: Sequence[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Size, torch.dtype]]:
    return [(name, t.shape, t.dtype) for name, t in named]


class PlanMemo:
    """The plan of a sized collection of tensors, kept for the next sync of tensors with the same names,
    shapes and dtypes in the same order. Between syncs it holds no tensor (`release`), only the layout."""

    def __init__(
        self, named: Sequence[tuple[str, torch.Tensor]], buckets: list[PlannedBucket], totals: PlanTotals
    ) -> None:
        self._signature = _signature(named)
        self.buckets = buckets
        self.totals = totals

    def matches(self, named: Sequence[tuple[str, torch.Tensor]]) -> bool:
        return len(named) == len(self._signature) and _signature(named) == self._signature

    def bind(self, named: Sequence[tuple[str, torch.Tensor]]) -> Iterator[PlannedBucket]:
        """The buckets, each one's chunks pointed at `named` (which `matches`) just before it is yielded,
        so that the first bucket's copies start before the last tensor is looked at."""
        last, flat = -1, _NO_SOURCE
        for bucket in self.buckets:
            for c in bucket.chunks:  # a tensor's chunks are consecutive
                if c.tensor != last:
                    last, flat = c.tensor, named[c.tensor][1].detach().contiguous().view(-1)
                c.flat = flat
            yield bucket

    def release(self) -> None:
        """Drop the references to the last sync's tensors (the caller may free them)."""
        for bucket in self.buckets:
            for c in bucket.chunks:
                c.flat = _NO_SOURCE


def pack_chunks(buf: torch.Tensor, chunks: list[Chunk], non_blocking: bool = False) -> None:
    """Copy (and cast) each chunk into the uint8 buffer `buf` at its bucket-relative bytes."""
    PreparedPack(chunks, [buf]).run(chunks, non_blocking)


class PreparedPack:
    """One stable bucket packed into fixed target buffers: the destination views are made once; each
    `run` reads the chunks' current sources (re-pointed at each sync's tensors by `PlanMemo.bind`)."""

    def __init__(self, chunks: list[Chunk], targets: list[torch.Tensor]) -> None:
        self.large: list[tuple[int, torch.Tensor]] = []  # (chunk number, destination)
        self.small_chunks: list[int] = []
        self.small_dst: list[torch.Tensor] = []
        for t in targets:
            for i, c in enumerate(chunks):
                dst = t[c.lo : c.hi].view(c.out_dtype)
                if c.hi - c.lo < SMALL_CHUNK_BYTES:
                    self.small_chunks.append(i)
                    self.small_dst.append(dst)
                else:
                    self.large.append((i, dst))

    def run(self, chunks: list[Chunk], non_blocking: bool = False) -> None:
        def source(c: Chunk) -> torch.Tensor:
            return c.flat if c.start == 0 and c.stop == c.flat.numel() else c.flat[c.start : c.stop]

        for i, dst in self.large:
            dst.copy_(source(chunks[i]), non_blocking=non_blocking)
        if self.small_dst:
            torch._foreach_copy_(
                self.small_dst, [source(chunks[i]) for i in self.small_chunks], non_blocking=non_blocking
            )


class PackCache:
    """The `PreparedPack`s of stable chunk lists into one set of target buffers (each receiver's
    staging), kept from one sync to the next while the targets are the same tensors."""

    def __init__(self) -> None:
        self._targets: list[torch.Tensor] = []
        self._last: dict[int, tuple[list[Chunk], PreparedPack]] = {}  # id(chunks) -> (chunks, pack)
        self._this: dict[int, tuple[list[Chunk], PreparedPack]] = {}

    def start(self, targets: list[torch.Tensor]) -> None:
        """A sync into `targets` begins: packs prepared for other buffers are dropped."""
        same = len(targets) == len(self._targets) and all(a is b for a, b in zip(targets, self._targets))
        self._last = (self._this or self._last) if same else {}
        self._this = {}
        self._targets = targets

    def pack(self, chunks: list[Chunk], base: int, end: int, non_blocking: bool = False) -> None:
        """Pack stream bytes [base, end) of a stable chunk list into every target."""
        entry = self._last.get(id(chunks))
        if entry is None or entry[0] is not chunks:  # (the list itself is kept, so its id is not reused)
            entry = (chunks, PreparedPack(chunks, [t[base:end] for t in self._targets]))
        self._this[id(chunks)] = entry
        entry[1].run(chunks, non_blocking)

    def clear(self) -> None:
        self._targets, self._last, self._this = [], {}, {}


def stream_views(staging: torch.Tensor, metas: Iterable[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views of a staged stream (uint8 tensor laid out like the stream)."""
    for m in metas:
        dtype = dtype_from_name(m.dtype)
        t = staging[m.offset : m.offset + m.nbytes].view(dtype).view(m.shape)
        yield m.name, t
