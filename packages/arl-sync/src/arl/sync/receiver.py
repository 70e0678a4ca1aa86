"""`WeightReceiver`: the engine side. Joins a sender on first use, stages each sync's bytes, and
applies them only once the whole transfer arrived intact.

`receive(apply)` is the atomic form: `apply` is called once, after the last byte landed and the
counts matched, with (name, tensor) views of the staging buffer; a transfer that fails or is aborted
never reaches `apply`, so the target keeps its old weights. `iter_tensors()` is the streaming form:
tensors are yielded as soon as their bytes landed (not atomic: pause the target while consuming).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

import torch

from .channel import ReceiverChannel, peer_alive, pid_namespace
from .errors import (
    ApplyError,
    ProtocolError,
    SenderLostError,
    SyncConfigError,
    SyncError,
    SyncTimeoutError,
    TransferAbortedError,
)
from .plan import stream_views, validate
from .staging import Staging
from .transports import ReceiverTransport, make_receiver_transport
from .types import (
    Abort,
    Ack,
    Begin,
    Bucket,
    Bye,
    Commit,
    Done,
    End,
    Hello,
    SyncConfig,
    TensorMeta,
    ToReceiver,
    Welcome,
)

_TICK_S = 0.05
_LATE_ABORT_S = 1.0

ApplyFn = Callable[[Iterable[tuple[str, torch.Tensor]]], object]


class WeightReceiver:
    """Receives syncs from the `WeightSender` at `address`.

    `device` is where staged tensors live (default: "cpu" for the "cpu" and "tcp" transports, else the current
    CUDA device). Tensors handed to `apply` or yielded by `iter_tensors` are views of a staging
    buffer reused by the next sync: copy what you keep (a model's `load_weights` does), or pass
    `reuse_staging=False` to get fresh memory every sync.
    """

    def __init__(
        self,
        address: str,
        cfg: SyncConfig,
        device: torch.device | str | None = None,
        reuse_staging: bool = True,
    ) -> None:
        validate(cfg.bucket_bytes, cfg.align_bytes)
        self.cfg = cfg
        self.address = address
        if device is None:
            device = "cpu" if cfg.transport in ("cpu", "tcp") else f"cuda:{torch.cuda.current_device()}"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if cfg.transport not in ("cpu", "tcp") and self.device.type != "cuda":
            raise SyncConfigError(f"transport {cfg.transport!r} needs a CUDA device, got {self.device}")
        self.receiver_id = uuid.uuid4().hex
        self._channel = ReceiverChannel(address, self.receiver_id.encode())
        self._transport: ReceiverTransport | None = None
        self._welcome: Welcome | None = None
        self._staging = Staging(self.device, reuse=reuse_staging)
        self._lock = threading.Lock()
        self._closed = False
        #: The version of the last sync applied (or fully streamed); None before the first.
        self.version: int | None = None
        #: Metadata of the last complete sync, in stream order.
        self.last_tensors: list[TensorMeta] = []

    # ---- joining -------------------------------------------------------------------------------

    def _recv(self, timeout_s: float, what: str, in_sync: bool = False) -> ToReceiver:
        """The next message within `timeout_s`; checks the sender's liveness every tick (`in_sync`:
        also through the transport, whose connection only stays up while a sync may use it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise SyncTimeoutError(
                    f"{what}: nothing from the sender at {self.address} within {timeout_s:.1f}s"
                )
            msg = self._channel.recv(min(_TICK_S, deadline - now))
            if msg is not None:
                return msg
            if in_sync:
                self._check_sender()
            else:
                self._check_sender_pid()

    def join(self, timeout_s: float | None = None) -> None:
        """Say hello and set the transport up (done by the first receive if not called)."""
        if self._transport is not None:
            return
        timeout_s = self.cfg.timeout_s if timeout_s is None else timeout_s
        self._channel.send(
            Hello(
                receiver_id=self.receiver_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                pidns=pid_namespace(),
                device=str(self.device),
                transport=self.cfg.transport,
                bucket_bytes=self.cfg.bucket_bytes,
            )
        )
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._recv(max(0.0, deadline - time.monotonic()), "joining")
            if isinstance(msg, Welcome):
                break  # anything else predates our hello: drop it
        if msg.error:
            raise SyncConfigError(f"the sender at {self.address} refused this receiver: {msg.error}")
        peer = self.address.removeprefix("tcp://").rpartition(":")[0].strip("[]")
        self._transport = make_receiver_transport(self.cfg, self.device, msg.info, peer)
        self._welcome = msg

    # ---- one sync ------------------------------------------------------------------------------

    def _transfer(self, timeout_s: float | None, stream: bool) -> Iterator[tuple[str, torch.Tensor] | End]:
        """Run one sync; yields tensors as they complete if `stream`, and finally the `End` message."""
        timeout_s = self.cfg.timeout_s if timeout_s is None else timeout_s
        self.join(timeout_s)
        tr = self._transport
        assert tr is not None
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._recv(max(0.0, deadline - time.monotonic()), "waiting for a sync to start")
            if isinstance(msg, Begin):
                break  # Bucket/End/Abort before a Begin belong to a sync this receiver left: skip
        begin = msg
        sid = begin.sync_id
        B = self.cfg.bucket_bytes
        tmo = self.cfg.timeout_s
        staging = self._staging
        metas: list[TensorMeta] = []
        yielded = 0
        filled = 0
        expected = 0
        try:
            if begin.info:
                self._channel.send(Ack(sid, -1))  # about to join the transport's group
            tr.begin(begin.info, tmo)
            staging.reserve(begin.size_hint)
            export = getattr(tr, "export", None)
            if export is not None:  # the sender writes straight into our staging buffer
                self._channel.send(Ack(sid, -1, info=export(staging.buf)))
            deferred = bool(getattr(tr, "lands_at_end", False))
            while True:
                msg = self._recv(tmo, f"sync {sid}: waiting for bucket {expected}", in_sync=True)
                if isinstance(msg, Bucket):
                    if msg.sync_id != sid or msg.index != expected:
                        raise ProtocolError(
                            f"expected bucket {expected} of sync {sid}, got {msg.index} of {msg.sync_id}"
                        )
                    lo = msg.index * B
                    if lo + msg.nbytes > staging.capacity:
                        if export is not None:
                            raise ProtocolError(
                                f"sync {sid}: bucket {msg.index} ends at byte {lo + msg.nbytes}, beyond the "
                                f"{staging.capacity}-byte staging buffer the sender writes into"
                            )
                        tr.wait(tmo, self._check_sender)  # in-flight writes must land before a move
                        staging.ensure(lo + msg.nbytes, filled)
                    tr.fetch(msg.slot, msg.nbytes, staging.slice(lo, lo + msg.nbytes))
                    if tr.needs_acks:
                        self._channel.send(Ack(sid, msg.index))
                    metas.extend(msg.tensors)
                    filled = lo + msg.nbytes
                    expected += 1
                    if stream and not deferred:  # (deferred: bytes are known to have landed only at End)
                        tr.wait(tmo, self._check_sender)
                        while (
                            yielded < len(metas) and metas[yielded].offset + metas[yielded].nbytes <= filled
                        ):
                            yield from stream_views(staging.buf, metas[yielded : yielded + 1])
                            yielded += 1
                elif isinstance(msg, End):
                    if (
                        msg.sync_id != sid
                        or msg.buckets != expected
                        or msg.tensors != len(metas)
                        or (msg.stream_bytes != filled and expected > 0)
                    ):
                        raise ProtocolError(
                            f"sync {sid} ended with {msg.buckets} buckets/{msg.tensors} tensors/{msg.stream_bytes} "
                            f"bytes, received {expected}/{len(metas)}/{filled}"
                        )
                    tr.wait(tmo, self._check_sender)
                    self._channel.send(Done(sync_id=sid, ok=True))
                    if stream:
                        yield from stream_views(staging.buf, metas[yielded:])
                    self._await_commit(sid, tmo)
                    self.last_tensors = metas
                    yield msg
                    return
                elif isinstance(msg, Abort):
                    if msg.sync_id == sid:
                        raise TransferAbortedError(f"the sender aborted sync {sid}: {msg.reason}")
                elif isinstance(msg, Begin):
                    raise ProtocolError(f"sync {msg.sync_id} began before sync {sid} ended")
        except BaseException as e:
            try:
                tr.abort()
            except Exception:
                pass
            if isinstance(e, SenderLostError) and (late := self._late_abort(sid)) is not None:
                raise late from e  # the sender closed its connections to abort, then said so
            if not isinstance(e, TransferAbortedError):
                try:
                    self._channel.send(Done(sync_id=sid, ok=False, error=f"{type(e).__name__}: {e}"))
                except Exception:
                    pass
            raise

    def _await_commit(self, sid: int, timeout_s: float) -> None:
        """Two-phase end: the sync counts only once the sender saw every receiver's `Done`."""
        while True:
            msg = self._recv(timeout_s, f"sync {sid}: waiting for the sender's commit", in_sync=True)
            if isinstance(msg, Commit) and msg.sync_id == sid:
                return
            if isinstance(msg, Abort) and msg.sync_id == sid:
                raise TransferAbortedError(f"the sender aborted sync {sid}: {msg.reason}")
            if isinstance(msg, Begin):
                raise ProtocolError(f"sync {msg.sync_id} began before sync {sid} was committed")

    def _check_sender_pid(self) -> None:
        w = self._welcome
        if w is not None and not peer_alive(w.pidns, w.pid):
            raise SenderLostError(f"the sender (pid {w.pid}) at {self.address} died")

    def _check_sender(self) -> None:
        """Its pid, where it shares our host; else what the transport sees of it (a closed connection)."""
        self._check_sender_pid()
        lost = getattr(self._transport, "peer_lost", None)
        if lost is not None and lost():
            raise SenderLostError(
                f"the sender at {self.address} closed its data connection (it died or closed)"
            )

    def _late_abort(self, sid: int) -> TransferAbortedError | None:
        """An `Abort` of sync `sid` arriving within a moment: a sender aborting a sync closes its data
        connections first, so their end can be seen before its message."""
        deadline = time.monotonic() + _LATE_ABORT_S
        while (left := deadline - time.monotonic()) > 0:
            msg = self._channel.recv(min(_TICK_S, left))
            if isinstance(msg, Abort) and msg.sync_id == sid:
                return TransferAbortedError(f"the sender aborted sync {sid}: {msg.reason}")
        return None

    def receive(self, apply: ApplyFn | None = None, timeout_s: float | None = None) -> int:
        """Receive one whole sync, then call `apply` once with its (name, tensor) pairs.

        `timeout_s` bounds the wait for the sync to start (default `cfg.timeout_s`); each later wait is
        bounded by `cfg.timeout_s`. Returns the version. If the transfer fails, raises
        (`TransferAbortedError`, `SyncTimeoutError`, `SenderLostError`, ...) without calling `apply`.
        """
        if self._closed:
            raise SyncError("the receiver is closed")
        with self._lock:
            end: End | None = None
            for item in self._transfer(timeout_s, stream=False):
                if isinstance(item, End):
                    end = item
            assert end is not None
            if apply is not None:
                try:
                    apply(stream_views(self._staging.buf, self.last_tensors))
                except Exception as e:
                    raise ApplyError(
                        f"apply failed for version {end.version}: {type(e).__name__}: {e}"
                    ) from e
            self.version = end.version
            return end.version

    def iter_tensors(self, timeout_s: float | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Receive one sync, yielding each (name, tensor) as soon as its bytes landed.

        `version` is set once the generator is exhausted. Closing the generator early fails the sync
        (the sender raises `ReceiverLostError`).
        """
        if self._closed:
            raise SyncError("the receiver is closed")
        with self._lock:
            for item in self._transfer(timeout_s, stream=True):
                if isinstance(item, End):
                    self.version = item.version
                else:
                    yield item

    def staged(self) -> list[tuple[str, torch.Tensor]]:
        """The tensors of the last complete sync (views of the staging buffer)."""
        return list(stream_views(self._staging.buf, self.last_tensors))

    def close(self) -> None:
        """Leave the group (the sender forgets this receiver) and release the transport."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._transport is not None:
                self._channel.send(Bye(self.receiver_id))
                self._transport.close()
        finally:
            self._channel.close(linger_ms=200)

    def __enter__(self) -> WeightReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
