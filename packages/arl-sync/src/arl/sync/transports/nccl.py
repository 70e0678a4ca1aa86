"""The "nccl" transport: bucket k is broadcast from the sender's GPU (rank 0) to every receiver's GPU,
through CuPy's NCCL binding (no torch.distributed process group, so it coexists with the trainer's
own). The group is built once, when a sync starts with a new membership, and reused by later syncs.

Sender: slot k % 2 is packed on a copy stream, broadcast on a communication stream that waits for
the pack, so packing bucket k+1 overlaps broadcasting bucket k. Receiver: each broadcast lands
directly in its slice of the staging buffer (no receive buffer, no unpack copy). Every wait polls a
CUDA event with a deadline and aborts the communicator on timeout, so a lost peer never hangs a side
(except inside group creation, which NCCL offers no timeout for: the sender only starts it after
every receiver announced it is about to join).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import torch

from ..errors import TransportError
from ..net import source_address, use_interface_of
from ..plan import Chunk, pack_chunks
from ..types import SyncConfig
from .base import wait_event


class _Group(msgspec.Struct):
    uid: list[int]
    rank: int
    world: int
    #: CuPy >= 14 gives (and takes) the unique id as bytes; older CuPy as a tuple of ints.
    uid_bytes: bool = False


def _unique_id(nccl) -> tuple[list[int], bool]:
    raw = nccl.get_unique_id()
    return list(raw), isinstance(raw, bytes | bytearray)


def _preload_libnccl() -> None:
    """Load the libnccl.so.2 of the `nvidia-nccl-*` wheel (the one torch uses) so that CuPy's NCCL
    module, linked against that soname, finds it where the dynamic loader would not."""
    import ctypes
    import glob
    import os

    try:
        import nvidia.nccl  # type: ignore[import-not-found]
    except ImportError:
        return
    for root in list(getattr(nvidia.nccl, "__path__", [])):
        for lib in sorted(glob.glob(os.path.join(root, "lib", "libnccl.so*"))):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def _nccl():
    hint = "transport 'nccl' needs CuPy with NCCL (pip install arl-sync[cupy])"
    try:
        from cupy.cuda import nccl
    except ImportError:
        nccl = None
    except Exception as e:
        raise TransportError(f"{hint}: {e}") from e
    if nccl is None or not hasattr(nccl, "NcclCommunicator"):  # CuPy did not find libnccl.so.2
        _preload_libnccl()
        try:
            import importlib

            import cupy.cuda.nccl as nccl

            nccl = importlib.reload(nccl)
        except Exception as e:
            raise TransportError(f"{hint}: {e}") from e
        if not hasattr(nccl, "NcclCommunicator"):
            raise TransportError(f"{hint}: CuPy's NCCL module is unavailable (libnccl.so.2 not found)")
    return nccl


def _uint8(nccl) -> int:
    return getattr(nccl, "NCCL_UINT8", getattr(nccl, "NCCL_CHAR", 0))


def _make_comm(nccl, device: torch.device, world: int, uid: Sequence[int], rank: int, uid_bytes: bool):
    import cupy

    comm_id = bytes(b & 0xFF for b in uid) if uid_bytes else tuple(uid)
    try:
        with cupy.cuda.Device(device.index):
            return nccl.NcclCommunicator(world, comm_id, rank)
    except Exception as e:
        raise TransportError(f"NCCL group init failed (rank {rank} of {world}): {e}") from e


def _abort(comm) -> None:
    if comm is None:
        return
    try:
        comm.abort()
    except Exception:
        try:
            comm.destroy()
        except Exception:
            pass


class NcclSender:
    """Rank 0 of the broadcast group."""

    needs_acks = False
    #: Receivers must say they are about to join (Ack index -1) before the group is created.
    needs_ready = True
    #: The sender announces a bucket before broadcasting it: NCCL (>= 2.22) connects the ranks lazily,
    #: inside the first collective, and that host call blocks until every rank entered it, so a
    #: receiver must be able to enter bucket 0's broadcast before the sender's call returns.
    announce_before_post = True

    def __init__(self, cfg: SyncConfig, device: torch.device | None, host: str = "127.0.0.1") -> None:
        if not torch.cuda.is_available():
            raise TransportError("transport 'nccl' needs CUDA")
        use_interface_of(host)  # the group's bootstrap listens where the receivers reach this node
        self._nccl = _nccl()
        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._dev = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        B = cfg.bucket_bytes
        self._buf = torch.empty(2 * B, dtype=torch.uint8, device=self._dev)
        self._slots = [self._buf[:B], self._buf[B:]]
        self._pack_stream = torch.cuda.Stream(self._dev)
        self._comm_stream = torch.cuda.Stream(self._dev)
        self._packed = [torch.cuda.Event(), torch.cuda.Event()]
        self._sent = [torch.cuda.Event(), torch.cuda.Event()]
        self._in_flight = [False, False]
        self._comm = None
        self._members: tuple[bytes, ...] = ()
        self._pending: _Group | None = None
        #: NCCL groups created so far (one per membership; later syncs reuse it).
        self.groups_built = 0

    def welcome_info(self, hello_device: str) -> bytes:
        return b""

    def begin(self, member_ids: Sequence[bytes]) -> dict[bytes, bytes]:
        if self._comm is not None and tuple(member_ids) == self._members:
            return {}
        _abort(self._comm)
        self._comm = None
        uid, uid_bytes = _unique_id(self._nccl)
        world = len(member_ids) + 1
        self._members = tuple(member_ids)
        self._pending = _Group(uid, 0, world, uid_bytes)
        return {
            m: msgspec.msgpack.encode(_Group(uid, i + 1, world, uid_bytes)) for i, m in enumerate(member_ids)
        }

    def connect(self, timeout_s: float) -> None:
        if self._pending is not None:
            g, self._pending = self._pending, None
            self._comm = _make_comm(self._nccl, self._dev, g.world, g.uid, 0, g.uid_bytes)
            self.groups_built += 1

    def wait_slot(self, slot: int, timeout_s: float, check: Callable[[], None]) -> None:
        if self._in_flight[slot]:
            wait_event(self._sent[slot], timeout_s, check, f"NCCL broadcast from slot {slot}")
            self._in_flight[slot] = False

    def pack(self, slot: int, chunks: list[Chunk], base: int = 0, stable: bool = False) -> None:
        ps = self._pack_stream
        ps.wait_stream(torch.cuda.current_stream(self._dev))  # sources were produced there
        with torch.cuda.stream(ps):
            pack_chunks(self._slots[slot], chunks, non_blocking=True)
        for c in chunks:
            if c.flat.is_cuda:
                c.flat.record_stream(ps)  # keep a lazily produced source alive until packed
        self._packed[slot].record(ps)

    def post(self, slot: int, nbytes: int) -> None:
        if self._comm is None:
            raise TransportError("no NCCL group")
        cs = self._comm_stream
        cs.wait_event(self._packed[slot])
        try:
            with torch.cuda.device(self._dev):  # send() may run in a thread whose current device differs
                self._comm.bcast(self._slots[slot].data_ptr(), nbytes, _uint8(self._nccl), 0, cs.cuda_stream)
        except Exception as e:
            raise TransportError(f"NCCL broadcast failed: {e}") from e
        self._sent[slot].record(cs)
        self._in_flight[slot] = True

    def finish(self, timeout_s: float, check: Callable[[], None]) -> None:
        for s in (0, 1):
            self.wait_slot(s, timeout_s, check)

    def abort(self) -> None:
        _abort(self._comm)
        self._comm = None
        self._members = ()
        self._in_flight = [False, False]

    def close(self) -> None:
        self.abort()
        self._slots = []


class NcclReceiver:
    """Rank >= 1: broadcasts land straight in the staging buffer."""

    needs_acks = False

    def __init__(self, cfg: SyncConfig, device: torch.device, info: bytes, peer: str = "") -> None:
        if peer:  # bind the interface this node reaches the sender's node through
            use_interface_of(source_address(peer))
        self._nccl = _nccl()
        self._dev = device
        self._stream = torch.cuda.Stream(device)
        self._comm = None
        self._last: torch.cuda.Event | None = None

    def begin(self, info: bytes, timeout_s: float) -> None:
        if info:
            _abort(self._comm)
            self._comm = None
            g = msgspec.msgpack.decode(info, type=_Group)
            self._comm = _make_comm(self._nccl, self._dev, g.world, g.uid, g.rank, g.uid_bytes)
        elif self._comm is None:
            raise TransportError("the sender reused an NCCL group this receiver is not part of")

    def fetch(self, slot: int, nbytes: int, dst: torch.Tensor) -> None:
        assert self._comm is not None
        self._stream.wait_stream(torch.cuda.current_stream(self._dev))  # staging allocated there
        try:
            with torch.cuda.device(self._dev):  # receive() may run in a thread whose current device differs
                self._comm.bcast(dst.data_ptr(), nbytes, _uint8(self._nccl), 0, self._stream.cuda_stream)
        except Exception as e:
            raise TransportError(f"NCCL broadcast failed: {e}") from e
        ev = torch.cuda.Event()
        ev.record(self._stream)
        self._last = ev

    def wait(self, timeout_s: float, check: Callable[[], None]) -> None:
        if self._last is not None:
            wait_event(self._last, timeout_s, check, "NCCL broadcast into staging")
            self._last = None
        torch.cuda.current_stream(self._dev).wait_stream(self._stream)

    def abort(self) -> None:
        _abort(self._comm)
        self._comm = None
        self._last = None

    def close(self) -> None:
        self.abort()
