"""The local sandbox's network side: sockets opened inside its network namespace, served from the host.

The sandbox has a network namespace of its own with only loopback. Two things listen there, both
owned by the environment's host process (a socket keeps the namespace it was created in, so a thread
`setns`es in, opens the socket, and returns):
- `DnsRecorder`, on the sandbox's 127.0.0.1:53 (its resolv.conf points there): it answers every query
  REFUSED at once (tools fail fast instead of timing out) and appends the name asked for to a JSONL
  file in the trial directory. That is how a verifier that tries to install its tools from the network
  is told apart from a solution that is wrong (`arl.harbor.trial_loop` reads the file).
- `PortForward`s, the explicit opt-in routes: sandbox 127.0.0.1:<port> → a host address (e.g. the
  arl proxy, for agents that run inside the sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any


def socket_in_netns(netns: str, kind: int, address: tuple[str, int]) -> socket.socket:
    """A socket bound to `address` inside the network namespace at path `netns` (listening if TCP)."""
    result: dict[str, Any] = {}

    def work() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(netns, os.O_RDONLY)
        try:
            os.setns(target, os.CLONE_NEWNET)
            try:
                sock = socket.socket(socket.AF_INET, kind)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
                if kind == socket.SOCK_STREAM:
                    sock.listen(64)
                sock.setblocking(False)
                result["sock"] = sock
            finally:
                os.setns(own, os.CLONE_NEWNET)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = e
        finally:
            os.close(own)
            os.close(target)

    thread = threading.Thread(target=work, name="arl-sandbox-netns")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["sock"]


def _query_name(packet: bytes) -> str:
    """The first question's name of a DNS query ("" when malformed)."""
    labels, i = [], 12
    try:
        while packet[i]:
            length = packet[i]
            labels.append(packet[i + 1 : i + 1 + length].decode(errors="replace"))
            i += 1 + length
    except IndexError:
        return ""
    return ".".join(labels)


class DnsRecorder(asyncio.DatagramProtocol):
    """Answers REFUSED to every DNS query and records the names asked for (see the module docstring)."""

    def __init__(self, log_path: Path, session_id: str) -> None:
        self.log_path = log_path
        self.session_id = session_id
        self.names: list[str] = []
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < 12:
            return
        name = _query_name(data)
        self.names.append(name)
        with contextlib.suppress(OSError), open(self.log_path, "a") as f:
            f.write(json.dumps({"t": time.time(), "name": name, "session": self.session_id}) + "\n")
        # Same id and question; QR=1, RD copied, RA=1, RCODE=5 (REFUSED); no answers.
        flags = 0x8000 | (int.from_bytes(data[2:4], "big") & 0x0100) | 0x0080 | 5
        reply = data[:2] + flags.to_bytes(2, "big") + data[4:6] + b"\x00\x00\x00\x00\x00\x00" + data[12:]
        if self._transport is not None:
            self._transport.sendto(reply, addr)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class SandboxNetwork:
    """The DNS recorder and port forwards of one sandbox; `close` stops them."""

    def __init__(self) -> None:
        self._closers: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.dns: DnsRecorder | None = None

    async def start(
        self, netns: str, *, log_path: Path, session_id: str, routes: dict[int, tuple[str, int]]
    ) -> None:
        loop = asyncio.get_running_loop()
        sock = socket_in_netns(netns, socket.SOCK_DGRAM, ("127.0.0.1", 53))
        transport, self.dns = await loop.create_datagram_endpoint(
            lambda: DnsRecorder(log_path, session_id), sock=sock
        )
        self._closers.append(transport)
        for port, target in routes.items():
            listener = socket_in_netns(netns, socket.SOCK_STREAM, ("127.0.0.1", port))
            server = await asyncio.start_server(self._forwarder(target), sock=listener)
            self._closers.append(server)

    def _forwarder(self, target: tuple[str, int]) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*target), 30)
            except (OSError, TimeoutError):
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        return handle

    async def close(self) -> None:
        for closer in self._closers:
            closer.close()
        self._closers = []


def parse_routes(routes: list[str] | tuple[str, ...]) -> dict[int, tuple[str, int]]:
    """ "PORT" (sandbox 127.0.0.1:PORT → host 127.0.0.1:PORT) or "PORT=HOST:HOSTPORT" → {port: (host, port)}."""
    out: dict[int, tuple[str, int]] = {}
    for route in routes:
        listen, _, target = str(route).partition("=")
        try:
            port = int(listen)
            host, _, host_port = (target or f"127.0.0.1:{port}").rpartition(":")
            out[port] = (host or "127.0.0.1", int(host_port))
        except ValueError:
            raise ValueError(f"route {route!r} must look like PORT or PORT=HOST:PORT") from None
    return out
