"""The "tcp" transport: buckets stream over one TCP connection per receiver, for hosts that share no memory.

The sender listens on its node's address (the `host` the `WeightSender` binds its metadata socket to)
and announces it in `Welcome`. Connections are made at the start of a sync whose membership is new
(as the NCCL transport builds its group): the sender gives every participant a one-time token in
`Begin.info`, each receiver says it is about to join (`Ack(-1)`), dials the sender and sends its
token, and the sender accepts until every token arrived. Later syncs with the same members reuse the
connections; any abort closes them all, so a half-sent bucket never shifts the next sync's stream.

Sender: bucket k is packed into slot k % 2 (host memory), then each receiver's connection sends it from
its own writer thread, so packing bucket k+1 overlaps sending bucket k, and a slow receiver delays
only its own stream until the slot is needed again. Receiver: each bucket is read straight into its
slice of the staging buffer (`recv_into`, no intermediate copy; via a host buffer for a CUDA staging
buffer). The bytes are the sender's bytes, so a sync is bit-exact; atomicity is the receiver's (apply
only after `Commit`), as for every transport.

A lost peer shows as a broken connection: the sender's writes fail, the receiver's reads end, and
each side's liveness check (`peer_lost`) sees the connection's end between syncs, where pids on
another host cannot be checked. Every socket operation has a deadline (`SyncConfig.timeout_s`).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import msgspec
import torch

from ..errors import ReceiverLostError, SenderLostError, SyncTimeoutError, TransportError
from ..plan import Chunk, pack_chunks
from ..types import SyncConfig

TOKEN_BYTES = 16
_TICK_S = 0.05


class _TcpInfo(msgspec.Struct):
    host: str
    port: int


def _closed(sock: socket.socket) -> bool:
    """True when the peer closed or reset `sock` (nothing is ever sent the other way on a data socket,
    so a readable socket means its end)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _shut(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in sendall/recv_into on it
    except OSError:
        pass
    sock.close()


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


class _Connection:
    """One receiver's data connection on the sender, with the thread that writes to it."""

    def __init__(self, ident: bytes, sock: socket.socket) -> None:
        self.ident = ident
        self.sock = sock
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arl-sync-tcp")
        self.sent: list[Future[None] | None] = [None, None]  # the last send from each slot

    @property
    def name(self) -> str:
        return f"receiver {self.ident.decode(errors='replace')[:8]}"

    def close(self) -> None:
        _shut(self.sock)
        self.writer.shutdown(wait=True, cancel_futures=True)


class TcpSender:
    """Sender side: listens, accepts one connection per receiver, sends every bucket on each."""

    needs_acks = False

    def __init__(self, cfg: SyncConfig, host: str) -> None:
        if host in ("", "0.0.0.0", "::"):
            raise TransportError(
                f"transport 'tcp' needs the address receivers dial, not a wildcard ({host!r})"
            )
        self._cfg = cfg
        self._host = host
        self._listener = socket.create_server((host, 0), backlog=128)
        self._port = self._listener.getsockname()[1]
        B = cfg.bucket_bytes
        self._buf = torch.empty(2 * B, dtype=torch.uint8)
        self._slots = [self._buf[:B], self._buf[B:]]
        self._views = [memoryview(s.numpy()) for s in self._slots]
        self._conns: dict[bytes, _Connection] = {}
        self._pending: dict[bytes, bytes] = {}  # token -> ident, for connections not made yet
        self._lock = threading.Lock()
        #: Data connections accepted so far (one per receiver per new membership).
        self.connections_made = 0

    @property
    def address(self) -> str:
        return f"{self._host}:{self._port}"

    def welcome_info(self, hello_device: str) -> bytes:
        return msgspec.msgpack.encode(_TcpInfo(self._host, self._port))

    def begin(self, member_ids: Sequence[bytes]) -> dict[bytes, bytes]:
        live = all(m in self._conns and not _closed(self._conns[m].sock) for m in member_ids)
        if live and set(member_ids) == set(self._conns):
            return {}
        self._drop_all()
        self._pending = {os.urandom(TOKEN_BYTES): m for m in member_ids}
        return {m: token for token, m in self._pending.items()}

    def connect(self, timeout_s: float) -> None:
        """Accept one connection per pending token (each receiver dials after its `Ack(-1)`)."""
        deadline = time.monotonic() + timeout_s
        while self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(m.decode(errors="replace")[:8] for m in self._pending.values())
                raise SyncTimeoutError(
                    f"tcp: receiver(s) {missing} did not connect to {self.address} within {timeout_s:.1f}s"
                )
            self._listener.settimeout(min(left, 1.0))
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(max(0.1, min(left, 10.0)))
            try:
                token = _recv_exact(sock, TOKEN_BYTES)
            except (OSError, ConnectionError):
                sock.close()
                continue
            ident = self._pending.pop(token, None)
            if ident is None:  # a stale dialer (an earlier membership) or a stranger: not ours
                sock.close()
                continue
            sock.settimeout(self._cfg.timeout_s)
            _tune(sock)
            self._conns[ident] = _Connection(ident, sock)
            self.connections_made += 1

    def wait_slot(self, slot: int, timeout_s: float, check: Callable[[], None]) -> None:
        """Block until every connection finished sending the last bucket packed into `slot`."""
        deadline = time.monotonic() + timeout_s
        for conn in list(self._conns.values()):
            fut = conn.sent[slot]
            while fut is not None:
                try:
                    fut.result(timeout=_TICK_S)
                    break
                except FutureTimeout:
                    if time.monotonic() > deadline:
                        raise SyncTimeoutError(
                            f"tcp: sending a bucket to {conn.name} took over {timeout_s:.1f}s"
                        ) from None
                    check()
                except Exception as e:
                    raise ReceiverLostError(
                        f"tcp: the data connection to {conn.name} failed: {type(e).__name__}: {e}"
                    ) from e
            conn.sent[slot] = None

    def pack(self, slot: int, chunks: list[Chunk], base: int = 0, stable: bool = False) -> None:
        cuda = any(c.flat.is_cuda for c in chunks)
        pack_chunks(self._slots[slot], chunks)
        if cuda:
            torch.cuda.synchronize()

    def post(self, slot: int, nbytes: int) -> None:
        view = self._views[slot][:nbytes]
        for conn in self._conns.values():
            conn.sent[slot] = conn.writer.submit(conn.sock.sendall, view)

    def finish(self, timeout_s: float, check: Callable[[], None]) -> None:
        for slot in (0, 1):
            self.wait_slot(slot, timeout_s, check)

    def peer_lost(self, ident: bytes) -> bool:
        """The receiver's connection ended (it died or closed); False while it has none."""
        conn = self._conns.get(ident)
        return conn is not None and _closed(conn.sock)

    def abort(self) -> None:
        self._drop_all()

    def _drop_all(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._pending.clear()

    def close(self) -> None:
        self._drop_all()
        self._listener.close()


class TcpReceiver:
    """Receiver side: dials the sender when a sync asks it to, reads each bucket into staging."""

    needs_acks = False

    def __init__(self, cfg: SyncConfig, device: torch.device, info: bytes) -> None:
        try:
            where = msgspec.msgpack.decode(info, type=_TcpInfo)
        except msgspec.DecodeError as e:
            raise TransportError(f"tcp: bad sender address in Welcome: {e}") from e
        self._cfg = cfg
        self._peer = (where.host, where.port)
        self._device = device
        self._sock: socket.socket | None = None
        self._bounce = torch.empty(0, dtype=torch.uint8)  # host landing buffer for a CUDA staging buffer

    def begin(self, info: bytes, timeout_s: float) -> None:
        if not info:
            if self._sock is None or _closed(self._sock):
                raise TransportError("tcp: the sender reused a data connection this receiver does not hold")
            return
        _shut(self._sock)
        self._sock = None
        try:
            sock = socket.create_connection(self._peer, timeout=timeout_s)
        except OSError as e:
            raise SenderLostError(
                f"tcp: cannot connect to the sender's data port {self._peer[0]}:{self._peer[1]}: {e}"
            ) from e
        _tune(sock)
        sock.settimeout(self._cfg.timeout_s)
        try:
            sock.sendall(info)
        except OSError as e:
            sock.close()
            raise SenderLostError(f"tcp: the sender's data port closed while joining: {e}") from e
        self._sock = sock

    def fetch(self, slot: int, nbytes: int, dst: torch.Tensor) -> None:
        if self._sock is None:
            raise TransportError("tcp: no data connection (no Begin set one up)")
        if dst.is_cuda:
            if self._bounce.numel() < nbytes:
                self._bounce = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
            self._read_into(memoryview(self._bounce.numpy())[:nbytes])
            dst.copy_(self._bounce[:nbytes], non_blocking=True)
            torch.cuda.current_stream(dst.device).synchronize()
        else:
            self._read_into(memoryview(dst.numpy()))

    def _read_into(self, view: memoryview) -> None:
        assert self._sock is not None
        got, n = 0, len(view)
        try:
            while got < n:
                k = self._sock.recv_into(view[got:], n - got)
                if k == 0:
                    raise SenderLostError(
                        f"tcp: the sender at {self._peer[0]} closed the data connection "
                        f"{got} bytes into a {n}-byte bucket"
                    )
                got += k
        except TimeoutError:
            raise SyncTimeoutError(
                f"tcp: no bucket bytes from {self._peer[0]} within {self._cfg.timeout_s:.1f}s"
            ) from None
        except (ConnectionError, OSError) as e:
            if isinstance(e, SenderLostError):
                raise
            raise SenderLostError(f"tcp: the data connection to {self._peer[0]} failed: {e}") from e

    def wait(self, timeout_s: float, check: Callable[[], None]) -> None:
        pass  # fetch returns once the bytes are in place

    def peer_lost(self) -> bool:
        """The sender's connection ended (it died or closed it)."""
        return self._sock is not None and _closed(self._sock)

    def abort(self) -> None:
        _shut(self._sock)  # the stream may hold part of a bucket: the next sync connects afresh
        self._sock = None

    def close(self) -> None:
        self.abort()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed before sending its token")
        data += chunk
    return bytes(data)
