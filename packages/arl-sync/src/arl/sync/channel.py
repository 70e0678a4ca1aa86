"""The metadata channel: msgspec messages over ZeroMQ, ROUTER on the sender, DEALER on each receiver.

ROUTER/DEALER rather than PUB/SUB: every receiver says `Hello` and gets a `Welcome` before any
bucket is addressed to it, so a slow joiner never misses bucket 0, and the sender learns who it must
wait for. `ROUTER_MANDATORY` turns a send to a vanished receiver into an error instead of a silent drop.
Also here: the same-host liveness check of a peer process (pid + pid namespace).
"""

from __future__ import annotations

import os
import socket
import time

import msgspec
import zmq

from .errors import ReceiverLostError, SyncConfigError
from .types import ToReceiver, ToSender

_enc = msgspec.msgpack.Encoder()
_dec_to_sender = msgspec.msgpack.Decoder(ToSender)
_dec_to_receiver = msgspec.msgpack.Decoder(ToReceiver)


def pid_namespace() -> str:
    """An id of this process's pid namespace on this host ("" if unknown)."""
    try:
        return f"{socket.gethostname()}|{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def peer_alive(pidns: str, pid: int) -> bool:
    """False only when the peer shares our pid namespace and its pid no longer exists."""
    if not pidns or pidns != pid_namespace():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (dead child not yet reaped) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


class SenderChannel:
    """The sender's ROUTER socket. Not thread-safe: one thread at a time (the sender holds a lock)."""

    def __init__(self, host: str, port: int) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        try:
            if port == 0:
                port = self._sock.bind_to_random_port(f"tcp://{host}")
            else:
                self._sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            self._sock.close(0)
            raise SyncConfigError(f"cannot bind the metadata socket on {host}:{port}: {e}") from e
        self.address = f"tcp://{host}:{port}"
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)

    def send(self, ident: bytes, msg: msgspec.Struct) -> None:
        try:
            self._sock.send_multipart([ident, _enc.encode(msg)], copy=False)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                raise ReceiverLostError(f"receiver {ident.hex()} disconnected") from e
            raise

    def recv(self, timeout_s: float) -> tuple[bytes, ToSender] | None:
        """The next message, or None after `timeout_s`."""
        if not self._poller.poll(max(0, int(timeout_s * 1000))):
            return None
        ident, payload = self._sock.recv_multipart()
        return ident, _dec_to_sender.decode(payload)

    def close(self) -> None:
        self._sock.close(0)


class ReceiverChannel:
    """A receiver's DEALER socket, connected to the sender's address."""

    def __init__(self, address: str, ident: bytes) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, ident)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.connect(address)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)

    def send(self, msg: msgspec.Struct) -> None:
        self._sock.send(_enc.encode(msg), copy=False)

    def recv(self, timeout_s: float) -> ToReceiver | None:
        if not self._poller.poll(max(0, int(timeout_s * 1000))):
            return None
        return _dec_to_receiver.decode(self._sock.recv())

    def close(self, linger_ms: int = 0) -> None:
        self._sock.close(linger_ms)


def monotonic() -> float:
    return time.monotonic()
