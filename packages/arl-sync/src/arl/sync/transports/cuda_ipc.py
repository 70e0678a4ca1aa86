"""The "cuda_ipc" transport: one copy. Each receiver exports its staging buffer (GPU memory) through a
CUDA IPC handle; the sender opens it and writes every tensor straight to its place in the stream.

Per sync: the receiver reserves its staging buffer (sized from the sender's hint, which is exact from
the second sync on: the first sync of a lazy iterator is drawn into a list to size it), waits until
its previous `apply` finished reading it, and answers `Begin` with `Ack(-1, info=handle)`. The handle
carries a generation number, so the sender opens a receiver's buffer once and reuses the mapping
across syncs until the receiver reallocates. The sender then copies (and casts) each bucket's chunks
into every receiver's buffer on one copy stream, with no per-bucket synchronisation or acknowledgement,
and waits for the stream once before `End`: the bytes have landed when a receiver sees `End`.

Planning and launching a copy per tensor took the sender's host thread about as long as the copies
themselves (7B: 339 tensors, ~8 ms of copying), so for a stable plan (a trainer's parameter list, see
`PlanMemo`) the destination views in every receiver's buffer are made once and reused while the
mappings hold: a sync is then one copy launch per large chunk and one batched launch for the small ones.

Sender and receivers must be on one host; the receiver's GPU must be visible to the sender (the same
GPU, or a peer GPU the sender's process can see).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import TransportError
from ..plan import Chunk, PackCache, pack_chunks
from ..types import SyncConfig
from .base import wait_event


def _device_uuid(index: int) -> str:
    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return ""


def _local_index(uuid: str, fallback: int) -> int:
    if uuid:
        for i in range(torch.cuda.device_count()):
            if _device_uuid(i) == uuid:
                return i
    return fallback


@dataclass(slots=True)
class _Mapped:
    generation: int
    buf: torch.Tensor


class IpcSender:
    """Sender side: opens each receiver's exported staging buffer and packs straight into it."""

    needs_acks = False
    #: Receivers answer `Begin` with their staging handle (`Ack(-1, info=...)`), which `attach` takes.
    wants_staging = True
    #: Data is complete only after `finish`: the sender calls it before announcing `End`.
    lands_at_end = True

    def __init__(self, cfg: SyncConfig, device: torch.device | None) -> None:
        if not torch.cuda.is_available():
            raise TransportError("transport 'cuda_ipc' needs CUDA")
        self._dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        if self._dev.index is None:
            self._dev = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self._dev)
        self._done = torch.cuda.Event()
        self._mapped: dict[bytes, _Mapped] = {}
        self._targets: list[torch.Tensor] = []
        self._packs = PackCache()  # stable buckets' copies into the receivers' buffers, prepared once
        #: Receiver buffers opened so far (a mapping is reused while the receiver's generation holds).
        self.handles_opened = 0

    def welcome_info(self, hello_device: str) -> bytes:
        return b""

    def begin(self, member_ids: Sequence[bytes]) -> dict[bytes, bytes]:
        for gone in set(self._mapped) - set(member_ids):
            del self._mapped[gone]
        self._targets = []
        return {}

    def attach(self, infos: dict[bytes, bytes]) -> None:
        """Map every participant's staging buffer (`infos`: ident -> the receiver's `Ack(-1).info`)."""
        targets = []
        for ident, info in infos.items():
            try:
                generation, capacity, fn, args, uuid, index = pickle.loads(info)
            except Exception as e:
                raise TransportError(
                    f"bad CUDA IPC staging handle from a receiver: {type(e).__name__}: {e}"
                ) from e
            m = self._mapped.get(ident)
            if m is None or m.generation != generation:
                self._mapped.pop(ident, None)  # drop the old mapping before opening the new one
                try:
                    args = list(args)
                    if getattr(fn, "__name__", "") == "rebuild_cuda_tensor":
                        args[6] = _local_index(uuid, index)  # storage_device: that GPU under our numbering
                    with torch.cuda.device(self._dev):
                        buf = fn(*args)
                except Exception as e:
                    raise TransportError(
                        f"cannot open a receiver's CUDA IPC staging buffer: {type(e).__name__}: {e}"
                    ) from e
                if buf.numel() < capacity:
                    raise TransportError(f"receiver staging maps {buf.numel()} bytes, expected {capacity}")
                m = self._mapped[ident] = _Mapped(generation, buf[:capacity])
                self.handles_opened += 1
            targets.append(m.buf)
        self._targets = targets
        self._packs.start(targets)

    def connect(self, timeout_s: float) -> None:
        pass

    def wait_slot(self, slot: int, timeout_s: float, check: Callable[[], None]) -> None:
        pass

    def pack(self, slot: int, chunks: list[Chunk], base: int = 0, stable: bool = False) -> None:
        if not chunks:
            return
        end = base + max(c.hi for c in chunks)
        for t in self._targets:
            if end > t.numel():
                raise TransportError(
                    f"the stream outgrew a receiver's staging buffer ({end} > {t.numel()} bytes): the size "
                    "hint was wrong (tensor shapes changed between syncs?)"
                )
        s = self._stream
        s.wait_stream(torch.cuda.current_stream(self._dev))  # sources were produced there
        if stable:
            with torch.cuda.stream(s):
                self._packs.pack(chunks, base, end, non_blocking=True)
            return  # the caller holds the sources until the sync ends (after `finish`)
        with torch.cuda.stream(s):
            for t in self._targets:
                pack_chunks(t[base:end], chunks, non_blocking=True)  # chunk bytes are relative to `base`
        for c in chunks:
            if c.flat.is_cuda:
                c.flat.record_stream(s)  # keep a lazily produced source alive until copied

    def post(self, slot: int, nbytes: int) -> None:
        pass

    def finish(self, timeout_s: float, check: Callable[[], None]) -> None:
        self._done.record(self._stream)
        wait_event(self._done, timeout_s, check, "CUDA IPC copies into the receivers' staging")

    def abort(self) -> None:
        try:
            self._stream.synchronize()  # no copy may still be writing into a receiver's buffer
        except Exception:
            pass
        self._targets = []

    def close(self) -> None:
        self.abort()
        self._mapped.clear()
        self._packs.clear()


class IpcReceiver:
    """Receiver side: exports its staging buffer; the sender's copies land in it directly."""

    needs_acks = False
    lands_at_end = True

    def __init__(self, cfg: SyncConfig, device: torch.device, info: bytes) -> None:
        if device.type != "cuda":
            raise TransportError(f"transport 'cuda_ipc' stages on a CUDA device, got {device}")
        self._device = device
        self._exported: tuple[int, int] | None = None  # (data_ptr, capacity) of the exported buffer
        self._info = b""
        self._generation = 0

    def begin(self, info: bytes, timeout_s: float) -> None:
        pass

    def export(self, staging: torch.Tensor) -> bytes:
        """The handle of `staging` for the sender (re-exported only when the buffer changed). Waits
        for this process's pending work on it first: the sender overwrites it right after."""
        torch.cuda.current_stream(self._device).synchronize()
        key = (staging.data_ptr(), staging.numel())
        if self._exported != key:
            if staging.numel() == 0:
                raise TransportError(
                    "transport 'cuda_ipc' needs the stream size before the first bucket "
                    "(the sender sends a size hint)"
                )
            from torch.multiprocessing.reductions import reduce_tensor

            fn, args = reduce_tensor(staging)
            self._generation += 1
            index = staging.device.index if staging.device.index is not None else torch.cuda.current_device()
            self._info = pickle.dumps(
                (self._generation, staging.numel(), fn, args, _device_uuid(index), index)
            )
            self._exported = key
        return self._info

    def fetch(self, slot: int, nbytes: int, dst: torch.Tensor) -> None:
        pass  # the sender wrote (or is writing) the bucket into `dst` itself

    def wait(self, timeout_s: float, check: Callable[[], None]) -> None:
        pass  # the sender finished its copies before it sent `End`

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self._exported = None
