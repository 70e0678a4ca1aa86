"""Config, stats and wire types of arl-sync (msgspec structs).

`SyncConfig` is the only config; `SyncStats` is what `WeightSender.send` returns; the rest are the
metadata messages that travel over ZeroMQ between a sender and its receivers.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from arl.sync.errors import SyncConfigError

Transport = Literal["cpu", "tcp", "nccl", "cuda_ipc"]

MiB = 1 << 20


class SyncConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How weights move. Both sides must use the same values of `transport`, `bucket_bytes`, `align_bytes`.

    Fields:
        transport: "cpu" (host shared memory; sender and receivers on one host, tensors on any device),
            "tcp" (one TCP connection per receiver, from the sender's address; any hosts, tensors on any
            device, staged in host memory on the sender), "cuda_ipc" (send buffers in the sender's GPU
            memory, opened by receivers through CUDA IPC; one host), "nccl" (broadcast from the sender's
            GPU to every receiver's GPU, any hosts).
        bucket_bytes: size of one send buffer; two are allocated (double buffering). Multiple of `align_bytes`.
        timeout_s: the longest any single wait may last (a join, an acknowledgement, the next message).
        cast_dtype: if set (e.g. "bfloat16"), floating-point tensors are cast to it on the sender.
        align_bytes: every tensor starts at a multiple of this in the byte stream (power of two, >= 16).
        pin_memory: "cpu" transport only: page-lock the shared buffers when CUDA is present, so that
            device<->host copies run at full PCIe speed.
        shm_dir: "cpu" transport only: directory of the shared-memory file.
    """

    transport: Transport = "cpu"
    bucket_bytes: int = 64 * MiB
    timeout_s: float = 60.0
    cast_dtype: str | None = None
    align_bytes: int = 64
    pin_memory: bool = True
    shm_dir: str = "/dev/shm"

    def __post_init__(self) -> None:
        # The message starts with the field's name, so a caller can tell which one (the app names its key).
        if not self.timeout_s > 0:
            raise SyncConfigError(f"timeout_s must be > 0, got {self.timeout_s!r}")


class SyncStats(msgspec.Struct, kw_only=True, frozen=True):
    """The outcome of one `WeightSender.send`.

    `bytes` counts payload bytes (after any cast, padding excluded); `seconds` runs from the first
    tensor drawn from the iterator to the last receiver's confirmation; `gbps` is bytes / seconds / 1e9.
    `seconds` splits into `setup_seconds` (`Begin` until every receiver is ready: staging handles, group
    setup), `stream_seconds` (planning, packing and posting every bucket: the sender's own work, with the
    transport's copies still running where they are asynchronous), `land_seconds` (waiting for those
    copies, or the last collective) and `confirm_seconds` (`End` until every receiver confirmed).
    `plan_reused`: the tensors came as a list with the names, shapes and dtypes of the previous sync, so
    its bucket plan was reused instead of planned again.
    """

    version: int
    bytes: int
    seconds: float
    gbps: float
    buckets: int
    tensors: int
    receivers: int
    transport: str
    join_seconds: float = 0.0
    setup_seconds: float = 0.0
    stream_seconds: float = 0.0
    land_seconds: float = 0.0
    confirm_seconds: float = 0.0
    plan_reused: bool = False


class TensorMeta(msgspec.Struct, array_like=True, frozen=True):
    """One tensor in the byte stream: its bytes are stream[offset : offset + nbytes]."""

    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int


# ---- receiver -> sender -------------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", kw_only=True):
    """A receiver asks to join; `pidns` lets the sender check the receiver's pid on the same host."""

    receiver_id: str
    host: str
    pid: int
    pidns: str
    device: str
    transport: str
    bucket_bytes: int


class Ack(msgspec.Struct, tag="ack"):
    """The receiver has copied bucket `index` of sync `sync_id` out of the shared send buffer.

    Index -1 answers `Begin`: the receiver is about to join the transport's group, or (`info` set)
    here is its staging buffer for the sender to write into ("cuda_ipc")."""

    sync_id: int
    index: int
    info: bytes = b""


class Done(msgspec.Struct, tag="done", kw_only=True):
    """The receiver holds every byte of sync `sync_id` (ok) or failed (error says why)."""

    sync_id: int
    ok: bool
    error: str = ""


class Bye(msgspec.Struct, tag="bye"):
    """The receiver is closing and leaves the group."""

    receiver_id: str


# ---- sender -> receiver -------------------------------------------------------------------------


class Welcome(msgspec.Struct, tag="welcome", kw_only=True):
    """Reply to `Hello`: transport details the receiver needs (opaque to the channel)."""

    host: str
    pid: int
    pidns: str
    transport: str
    bucket_bytes: int
    info: bytes = b""
    error: str = ""


class Begin(msgspec.Struct, tag="begin", kw_only=True):
    """A sync starts. `size_hint` is the expected stream size (0 if unknown); `info` carries
    transport setup for this sync (e.g. a new NCCL group)."""

    sync_id: int
    version: int
    size_hint: int = 0
    info: bytes = b""


class Bucket(msgspec.Struct, tag="bucket", kw_only=True):
    """Bucket `index` (stream bytes [index*bucket_bytes, +nbytes)) is ready in buffer `slot`;
    `tensors` are those whose first byte lies in this bucket."""

    sync_id: int
    index: int
    slot: int
    nbytes: int
    tensors: list[TensorMeta]


class End(msgspec.Struct, tag="end", kw_only=True):
    """The last bucket was sent; the receiver checks the counts and answers `Done`."""

    sync_id: int
    version: int
    buckets: int
    tensors: int
    stream_bytes: int


class Commit(msgspec.Struct, tag="commit"):
    """Every receiver confirmed sync `sync_id` (`Done`): apply it. Until this arrives a receiver holds
    the new weights staged only, so a sync lost on one receiver leaves all of them on the old weights."""

    sync_id: int


class Abort(msgspec.Struct, tag="abort", kw_only=True):
    """The sender gave the sync up; receivers discard it."""

    sync_id: int
    reason: str


ToSender = Hello | Ack | Done | Bye
ToReceiver = Welcome | Begin | Bucket | End | Commit | Abort
