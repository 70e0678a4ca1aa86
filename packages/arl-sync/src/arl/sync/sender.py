"""`WeightSender`: the trainer side. Plans buckets, packs them into two alternating buffers, hands
them to the transport, and announces each over the metadata channel; waits for its receivers.

One `send` is one sync and is all-or-nothing across receivers: if any receiver dies, reports a
failure or stops answering, the sender aborts the sync for all of them (they keep their old weights)
and raises. Safe to call from a thread other than the one that built the sender (one sync at a time).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from .channel import SenderChannel, peer_alive, pid_namespace
from .errors import ReceiverLostError, SyncConfigError, SyncError, SyncTimeoutError, TransferAbortedError
from .plan import PlanMemo, PlannedBucket, PlanTotals, align_up, dtype_from_name, plan_buckets, validate
from .transports import SenderTransport, make_sender_transport
from .types import Abort, Ack, Begin, Bucket, Bye, Commit, Done, End, Hello, SyncConfig, SyncStats, Welcome

_TICK_S = 0.05


@dataclass(slots=True)
class _Member:
    ident: bytes
    hello: Hello

    @property
    def name(self) -> str:
        return f"receiver {self.hello.receiver_id[:8]} (pid {self.hello.pid} on {self.hello.host})"


@dataclass(slots=True)
class _SyncState:
    sync_id: int
    participants: list[bytes]
    acks: dict[int, set[bytes]] = field(default_factory=dict)
    done: set[bytes] = field(default_factory=set)
    staging: dict[bytes, bytes] = field(default_factory=dict)


def estimate_stream_bytes(
    named: Iterable[tuple[str, torch.Tensor]], align: int, cast: torch.dtype | None
) -> int:
    """The stream size of a sized collection of tensors (0 for a lazy iterator)."""
    if not isinstance(named, list | tuple):
        return 0
    pos = 0
    for _, t in named:
        dt = cast if cast is not None and t.dtype.is_floating_point else t.dtype
        pos = align_up(pos, align) + t.numel() * dt.itemsize
    return pos


class WeightSender:
    """Sends named tensors to `num_receivers` (or more) `WeightReceiver`s, one sync per `send`.

    The metadata socket is bound at construction (`address` is what receivers connect to); the
    transport's two bucket buffers are allocated then too and reused by every sync. `device` is the
    CUDA device of the send buffers for "nccl"/"cuda_ipc" (default: the current device).
    """

    def __init__(
        self,
        cfg: SyncConfig,
        num_receivers: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        device: torch.device | str | int | None = None,
    ) -> None:
        validate(cfg.bucket_bytes, cfg.align_bytes)
        if num_receivers < 1:
            raise SyncConfigError(f"num_receivers must be >= 1, got {num_receivers}")
        if cfg.timeout_s <= 0:
            raise SyncConfigError(f"timeout_s must be > 0, got {cfg.timeout_s}")
        self._cast = dtype_from_name(cfg.cast_dtype) if cfg.cast_dtype else None
        self.cfg = cfg
        self.num_receivers = num_receivers
        dev = torch.device(device) if isinstance(device, str | torch.device) else None
        if isinstance(device, int):
            dev = torch.device("cuda", device)
        self._channel = SenderChannel(host, port)
        try:
            self._transport: SenderTransport = make_sender_transport(cfg, dev, host)
        except BaseException:
            self._channel.close()
            raise
        self._members: dict[bytes, _Member] = {}
        self._sync: _SyncState | None = None
        self._sync_id = 0
        self._last_stream_bytes = 0
        self._memo: PlanMemo | None = None  # the last plan of a sized collection, reused while it matches
        self._lock = threading.Lock()
        self._cancelled = threading.Event()  # set by cancel() from another thread: the sync in progress stops
        self._closed = False
        self._last_alive_check = 0.0
        self._host = socket.gethostname()
        self._pidns = pid_namespace()

    @property
    def address(self) -> str:
        """What a `WeightReceiver` connects to, e.g. "tcp://127.0.0.1:5555"."""
        return self._channel.address

    # ---- message handling ----------------------------------------------------------------------

    def _handle(self, ident: bytes, msg: object) -> None:
        sync = self._sync
        if isinstance(msg, Hello):
            self._welcome(ident, msg)
        elif isinstance(msg, Ack):
            if sync is not None and msg.sync_id == sync.sync_id:
                sync.acks.setdefault(msg.index, set()).add(ident)
                if msg.index == -1 and msg.info:
                    sync.staging[ident] = msg.info
        elif isinstance(msg, Done):
            if sync is not None and msg.sync_id == sync.sync_id:
                if not msg.ok:
                    m = self._members.get(ident)
                    name = m.name if m else ident.hex()
                    raise ReceiverLostError(f"{name} failed during sync {msg.sync_id}: {msg.error}")
                sync.done.add(ident)
        elif isinstance(msg, Bye):
            m = self._members.pop(ident, None)
            if sync is not None and ident in sync.participants and ident not in sync.done:
                raise ReceiverLostError(f"{m.name if m else ident.hex()} closed during sync {sync.sync_id}")

    def _welcome(self, ident: bytes, hello: Hello) -> None:
        base = dict(
            host=self._host,
            pid=os.getpid(),
            pidns=self._pidns,
            transport=self.cfg.transport,
            bucket_bytes=self.cfg.bucket_bytes,
        )
        if hello.transport != self.cfg.transport or hello.bucket_bytes != self.cfg.bucket_bytes:
            err = (
                f"config mismatch: sender uses transport={self.cfg.transport!r} bucket_bytes="
                f"{self.cfg.bucket_bytes}, receiver {hello.transport!r} {hello.bucket_bytes}"
            )
            self._channel.send(ident, Welcome(**base, error=err))
            return
        try:
            info = self._transport.welcome_info(hello.device)
        except SyncError as e:
            self._channel.send(ident, Welcome(**base, error=str(e)))
            return
        self._channel.send(ident, Welcome(**base, info=info))
        self._members[ident] = _Member(ident, hello)

    def _check_alive(self, force: bool = False) -> None:
        """Raise if a participant of the current sync died; drop dead non-participants silently.
        Runs at most every 50 ms unless forced (it reads /proc)."""
        now = time.monotonic()
        if not force and now - self._last_alive_check < _TICK_S:
            return
        self._last_alive_check = now
        sync = self._sync
        for ident, m in list(self._members.items()):
            if not self._member_alive(ident, m):
                del self._members[ident]
                if sync is not None and ident in sync.participants and ident not in sync.done:
                    raise ReceiverLostError(f"{m.name} died during sync {sync.sync_id}")

    def _member_alive(self, ident: bytes, m: _Member) -> bool:
        """Its pid, where it shares our host; else what the transport sees of it (a closed connection)."""
        lost = getattr(self._transport, "peer_lost", None)
        return peer_alive(m.hello.pidns, m.hello.pid) and not (lost is not None and lost(ident))

    def _pump(self, until, timeout_s: float, what: str) -> None:
        """Handle incoming messages until `until()` holds; SyncTimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not until():
            if self._cancelled.is_set():
                raise TransferAbortedError(f"{what}: cancelled by the caller")
            now = time.monotonic()
            if now >= deadline:
                raise SyncTimeoutError(f"{what}: no answer within {timeout_s:.1f}s")
            got = self._channel.recv(min(_TICK_S, deadline - now))
            if got is not None:
                self._handle(*got)
                while (got := self._channel.recv(0)) is not None:  # drain what is queued
                    self._handle(*got)
            self._check_alive()

    def _poll(self) -> None:
        """Handle what is queued without waiting (and check liveness)."""
        while (got := self._channel.recv(0)) is not None:
            self._handle(*got)
        self._check_alive()

    def _broadcast(self, msg: object) -> None:
        assert self._sync is not None
        for ident in self._sync.participants:
            self._channel.send(ident, msg)

    # ---- the sync ------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop a `send` blocked in another thread (e.g. the receiving side already failed): it raises
        `TransferAbortedError` within one tick instead of waiting out `timeout_s`. The next `send`
        starts afresh."""
        self._cancelled.set()

    def wait_for_receivers(self, timeout_s: float | None = None) -> int:
        """Block until `num_receivers` receivers joined (they join on their first receive)."""
        with self._lock:
            return self._admit(self.cfg.timeout_s if timeout_s is None else timeout_s)

    def _admit(self, timeout_s: float) -> int:
        self._sync = None
        self._poll()
        self._check_alive(force=True)
        self._pump(
            lambda: len(self._members) >= self.num_receivers,
            timeout_s,
            f"waiting for {self.num_receivers} receiver(s) to join {self.address} ({len(self._members)} joined)",
        )
        return len(self._members)

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], version: int
    ) -> SyncStats:
        """Send every (name, tensor) to all receivers as weight version `version`.

        Blocks until every receiver holds all bytes; first waits (up to `timeout_s`) for
        `num_receivers` to join. Raises `ReceiverLostError` / `SyncTimeoutError` (after aborting the
        sync on every receiver) or whatever the tensor iterator raised.
        """
        try:
            return self._send(named_tensors, version)
        finally:
            self._cancelled.clear()  # a cancel() applies to the sync it interrupted, never to the next

    def _send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], version: int
    ) -> SyncStats:
        if self._closed:
            raise SyncError("the sender is closed")
        if isinstance(named_tensors, Mapping):
            named_tensors = list(named_tensors.items())
        cfg = self.cfg
        with self._lock:
            t_join = time.monotonic()
            self._admit(cfg.timeout_s)
            self._sync_id += 1
            sync = self._sync = _SyncState(self._sync_id, list(self._members))
            # A list (a trainer's parameters) is planned once and its plan reused while names, shapes and
            # dtypes stay the same; a lazy iterator (gathered shards) is planned as it is drawn.
            sized = isinstance(named_tensors, list | tuple)
            memo = (
                self._memo if sized and self._memo is not None and self._memo.matches(named_tensors) else None
            )
            if memo is not None:
                hint = memo.totals.stream_bytes
            else:
                self._memo = None
                hint = (
                    estimate_stream_bytes(named_tensors, cfg.align_bytes, self._cast)
                    or self._last_stream_bytes
                )
            wants_staging = getattr(self._transport, "wants_staging", False)
            if wants_staging and not hint:
                # Receivers must size the buffer the sender writes into before the first bucket: draw
                # a lazy iterator once (references to the tensors, not copies) to measure the stream.
                named_tensors = list(named_tensors)
                hint = estimate_stream_bytes(named_tensors, cfg.align_bytes, self._cast)
            lands_at_end = getattr(self._transport, "lands_at_end", False)
            t0 = time.monotonic()
            totals = memo.totals if memo is not None else PlanTotals()
            planned: list[PlannedBucket] | None = [] if sized and memo is None else None
            try:
                infos = self._transport.begin(sync.participants)
                for ident in sync.participants:
                    self._channel.send(
                        ident,
                        Begin(
                            sync_id=sync.sync_id, version=version, size_hint=hint, info=infos.get(ident, b"")
                        ),
                    )
                n = len(sync.participants)
                if infos or wants_staging:  # a group is being (re)built: create it only once every
                    # receiver is about to join / every receiver's staging buffer is known
                    self._pump(
                        lambda: len(sync.acks.get(-1, ())) >= n,
                        cfg.timeout_s,
                        f"sync {sync.sync_id}: waiting for receivers to start group setup",
                    )
                if wants_staging:
                    missing = [i for i in sync.participants if i not in sync.staging]
                    if missing:
                        raise SyncError(
                            f"sync {sync.sync_id}: {len(missing)} receiver(s) sent no staging buffer"
                        )
                    self._transport.attach({i: sync.staging[i] for i in sync.participants})
                self._transport.connect(cfg.timeout_s)
                t_stream = time.monotonic()
                buckets = (
                    memo.bind(named_tensors)
                    if memo is not None
                    else plan_buckets(named_tensors, cfg.bucket_bytes, cfg.align_bytes, self._cast, totals)
                )
                for bucket in buckets:
                    if planned is not None:
                        planned.append(bucket)
                    slot = bucket.index % 2
                    if self._transport.needs_acks and bucket.index >= 2:
                        acks = sync.acks
                        k = bucket.index - 2
                        self._pump(
                            lambda acks=acks, k=k: len(acks.get(k, ())) >= n,
                            cfg.timeout_s,
                            f"sync {sync.sync_id}: waiting for receivers to acknowledge bucket {k}",
                        )
                        acks.pop(k, None)
                    else:
                        self._poll()
                    self._transport.wait_slot(slot, cfg.timeout_s, self._poll)
                    self._transport.pack(slot, bucket.chunks, bucket.index * cfg.bucket_bytes, stable=sized)
                    msg = Bucket(
                        sync_id=sync.sync_id,
                        index=bucket.index,
                        slot=slot,
                        nbytes=bucket.nbytes,
                        tensors=bucket.tensors,
                    )
                    if getattr(self._transport, "announce_before_post", False):
                        # NCCL: posting may block this thread until every receiver entered the same
                        # collective (NCCL connects lazily, at the first one), so announce it first.
                        self._broadcast(msg)
                        self._transport.post(slot, bucket.nbytes)
                    else:
                        self._transport.post(slot, bucket.nbytes)
                        self._broadcast(msg)
                end = End(
                    sync_id=sync.sync_id,
                    version=version,
                    buckets=totals.buckets,
                    tensors=totals.tensors,
                    stream_bytes=totals.stream_bytes,
                )
                t_land = time.monotonic()
                if lands_at_end:  # the sender writes the receivers' memory: done before they hear End
                    self._transport.finish(cfg.timeout_s, self._poll)
                    self._broadcast(end)
                else:
                    self._broadcast(end)
                    self._transport.finish(cfg.timeout_s, self._poll)
                t_confirm = time.monotonic()
                self._pump(
                    lambda: len(sync.done) >= n,
                    cfg.timeout_s,
                    f"sync {sync.sync_id}: waiting for receivers to confirm",
                )
                self._broadcast(Commit(sync.sync_id))
                if planned is not None:
                    self._memo = PlanMemo(named_tensors, planned, totals)
            except BaseException as e:
                self._abort(sync, e)
                raise
            finally:
                self._sync = None
                if self._memo is not None:
                    self._memo.release()
            t_done = time.monotonic()
            seconds = t_done - t0
            self._last_stream_bytes = totals.stream_bytes
            return SyncStats(
                version=version,
                bytes=totals.payload_bytes,
                seconds=seconds,
                gbps=totals.payload_bytes / seconds / 1e9 if seconds > 0 else 0.0,
                buckets=totals.buckets,
                tensors=totals.tensors,
                receivers=len(sync.participants),
                transport=cfg.transport,
                join_seconds=t0 - t_join,
                setup_seconds=t_stream - t0,
                stream_seconds=t_land - t_stream,
                land_seconds=t_confirm - t_land,
                confirm_seconds=t_done - t_confirm,
                plan_reused=memo is not None,
            )

    def _abort(self, sync: _SyncState, exc: BaseException) -> None:
        try:
            self._transport.abort()
        except Exception:
            pass
        reason = f"{type(exc).__name__}: {exc}"
        for ident in sync.participants:
            if ident not in self._members:
                continue
            try:
                self._channel.send(ident, Abort(sync_id=sync.sync_id, reason=reason))
            except SyncError:
                self._members.pop(ident, None)
        if isinstance(exc, ReceiverLostError):
            # A lost receiver is dropped; the survivors stay members for the next sync.
            self._check_alive_quiet()

    def _check_alive_quiet(self) -> None:
        for ident, m in list(self._members.items()):
            if not self._member_alive(ident, m):
                del self._members[ident]

    def close(self) -> None:
        """Release the buffers and the socket. Receivers see the sender gone at their next wait."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            try:
                self._transport.close()
            finally:
                self._channel.close()

    def __enter__(self) -> WeightSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
