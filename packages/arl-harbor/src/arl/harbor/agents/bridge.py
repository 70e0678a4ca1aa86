"""A path from an agent inside the sandbox to the arl proxy on the host, with no network in the sandbox.

Agents that run inside the sandbox (mini-swe-agent) need the proxy's HTTP endpoint, but the task's
sandbox has no network (docker `network_mode: none`, or the local sandbox's own loopback-only
namespace), and the per-attempt proxy listens on a port chosen at random. The bridge carries the bytes
over a unix socket instead:

- host end (`ProxyBridge`): a unix socket in the trial's agent log dir, which both environments bind
  into the sandbox at `/logs/agent` (the local sandbox always; Harbor's docker environment with
  `auto_mounting=True`); each connection is piped to the proxy's TCP address;
- sandbox end (`FORWARDER_SOURCE`, stdlib-only Python run in the background inside the sandbox): listens
  on the sandbox's 127.0.0.1:PORT and pipes each connection to that socket.

The agent is then pointed at `http://127.0.0.1:PORT/...`: the same URL path as the proxy session's.
Nothing else is reachable through it: one socket, one target address, for the agent phase only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

SOCKET_NAME = "arl-proxy.sock"
_CLOSE_TIMEOUT_SEC = 5.0
_CONNECT_TIMEOUT_SEC = 30.0

# Runs inside the sandbox: `python3 - UNIX_PATH PORT READY_FILE`. Threads, stdlib only (any Python >= 3.6).
FORWARDER_SOURCE = r"""
import os, socket, sys, threading
unix_path, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

def serve(conn):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(unix_path)
    except OSError as e:
        sys.stderr.write("arl bridge: cannot reach %s: %s\n" % (unix_path, e))
        conn.close()
        return
    back = threading.Thread(target=pipe, args=(up, conn), daemon=True)
    back.start()
    pipe(conn, up)
    back.join()
    conn.close()
    up.close()

srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(128)
with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(ready + ".tmp", ready)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still carry the answer
    except (ConnectionError, OSError):
        writer.close()


class ProxyBridge:
    """The host end: a unix socket at `socket_path` whose connections are piped to `target` (host, port)."""

    def __init__(self, socket_path: Path, target: tuple[str, int]) -> None:
        self.socket_path = Path(socket_path)
        self.target = target
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Trial dirs can be deeper than sun_path's 108 bytes: bind through a descriptor of the dir.
        dir_fd = os.open(self.socket_path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            sock.bind(f"/proc/self/fd/{dir_fd}/{self.socket_path.name}")
        except OSError:
            sock.close()
            raise
        finally:
            os.close(dir_fd)
        # Root in a user namespace (the local sandbox) is another host uid: it must be able to connect.
        os.chmod(self.socket_path, 0o777)
        sock.setblocking(False)
        self._server = await asyncio.start_unix_server(self._handle, sock=sock, backlog=128)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), _CONNECT_TIMEOUT_SEC
                )
            except (OSError, TimeoutError):
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            up_writer.close()
            writer.close()
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), _CLOSE_TIMEOUT_SEC)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
