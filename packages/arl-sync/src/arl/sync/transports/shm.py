"""The "cpu" transport: two bucket slots in one host shared-memory file, mapped by sender and receivers.

The sender packs bucket k into slot k % 2 (a memcpy, or a device-to-host copy for GPU tensors) and
announces it; each receiver copies the slot into its staging buffer (a memcpy, or host-to-device) and
acknowledges; the sender reuses a slot once every receiver acknowledged it. Packing bucket k+1 thus
overlaps receivers copying bucket k. When CUDA is in use the mapping is page-locked
(cudaHostRegister), so the device<->host legs run at pinned PCIe speed. Needs one host (and one
/dev/shm) for sender and receivers.
"""

from __future__ import annotations

import mmap
import os
import uuid
import zlib
from collections.abc import Callable, Sequence

import msgspec
import torch

from ..channel import peer_alive, pid_namespace
from ..errors import TransportError
from ..plan import Chunk, pack_chunks
from ..types import SyncConfig


class _ShmInfo(msgspec.Struct):
    path: str
    size: int


def _map(path: str, size: int, create: bool) -> tuple[mmap.mmap, torch.Tensor]:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        raise TransportError(f"cannot open shared memory file {path}: {e}") from e
    try:
        if create:
            os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as e:
        raise TransportError(f"cannot map shared memory file {path} ({size} bytes): {e}") from e
    finally:
        os.close(fd)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf = torch.frombuffer(mm, dtype=torch.uint8)
    return mm, buf


class _Pinned:
    """Page-locks a host tensor's memory for CUDA (best effort) and unlocks it on release."""

    def __init__(self) -> None:
        self.ptr = 0

    def pin(self, buf: torch.Tensor) -> bool:
        if self.ptr or not torch.cuda.is_available():
            return bool(self.ptr)
        try:
            err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), 0)
        except Exception:
            return False
        ok = int(getattr(err, "value", err)) == 0
        if ok:
            self.ptr = buf.data_ptr()
        return ok

    def release(self) -> None:
        if self.ptr:
            try:
                torch.cuda.cudart().cudaHostUnregister(self.ptr)
            except Exception:
                pass
            self.ptr = 0


def _prefix() -> str:
    """File-name prefix naming this host and pid namespace, so a sweep only judges its own pids."""
    tag = zlib.crc32(pid_namespace().encode()) if pid_namespace() else 0
    return f"arl-sync-{tag:08x}-"


def _sweep_stale(shm_dir: str) -> None:
    """Unlink buffers left by senders of this pid namespace that died without closing."""
    if not pid_namespace():
        return
    prefix = _prefix()
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix) :].split("-", 1)[0])
        except ValueError:
            continue
        if not peer_alive(pid_namespace(), pid):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass


class ShmSender:
    """Sender side: creates the shared file (2 x bucket_bytes) and packs into it."""

    needs_acks = True

    def __init__(self, cfg: SyncConfig) -> None:
        self._cfg = cfg
        self._size = 2 * cfg.bucket_bytes
        _sweep_stale(cfg.shm_dir)
        self._path = os.path.join(cfg.shm_dir, f"{_prefix()}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        self._mm, self._buf = _map(self._path, self._size, create=True)
        self._slots = [self._buf[: cfg.bucket_bytes], self._buf[cfg.bucket_bytes :]]
        self._pinned = _Pinned()
        self._cuda_seen = False

    def welcome_info(self, hello_device: str) -> bytes:
        return msgspec.msgpack.encode(_ShmInfo(self._path, self._size))

    def begin(self, member_ids: Sequence[bytes]) -> dict[bytes, bytes]:
        return {}

    def connect(self, timeout_s: float) -> None:
        pass

    def wait_slot(self, slot: int, timeout_s: float, check: Callable[[], None]) -> None:
        pass

    def pack(self, slot: int, chunks: list[Chunk], base: int = 0, stable: bool = False) -> None:
        cuda = any(c.flat.is_cuda for c in chunks)
        if cuda and not self._cuda_seen:
            self._cuda_seen = True
            if self._cfg.pin_memory:
                self._pinned.pin(self._buf)
        pack_chunks(self._slots[slot], chunks, non_blocking=cuda and bool(self._pinned.ptr))
        if cuda:
            torch.cuda.synchronize()

    def post(self, slot: int, nbytes: int) -> None:
        pass

    def finish(self, timeout_s: float, check: Callable[[], None]) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self._pinned.release()
        self._slots = []
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass


class ShmReceiver:
    """Receiver side: maps the sender's file and copies a slot into staging."""

    needs_acks = True

    def __init__(self, cfg: SyncConfig, device: torch.device, info: bytes) -> None:
        meta = msgspec.msgpack.decode(info, type=_ShmInfo)
        self._mm, self._buf = _map(meta.path, meta.size, create=False)
        b = cfg.bucket_bytes
        self._slots = [self._buf[:b], self._buf[b:]]
        self._device = device
        self._pinned = _Pinned()
        if device.type == "cuda" and cfg.pin_memory:
            self._pinned.pin(self._buf)

    def begin(self, info: bytes, timeout_s: float) -> None:
        pass

    def fetch(self, slot: int, nbytes: int, dst: torch.Tensor) -> None:
        src = self._slots[slot][:nbytes]
        if dst.is_cuda:
            dst.copy_(src, non_blocking=bool(self._pinned.ptr))
            torch.cuda.current_stream(dst.device).synchronize()
        else:
            dst.copy_(src)

    def wait(self, timeout_s: float, check: Callable[[], None]) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self._pinned.release()
        self._slots = []
