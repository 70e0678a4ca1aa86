"""A small async client of the Docker Engine HTTP API over its unix socket, for the hot path of a trial.

Harbor's docker environment runs every exec and file copy as a `docker compose ...` CLI call: two Go
processes per call (the docker CLI and its compose plugin) that parse the trial's compose files and query
the daemon before doing anything. This client talks to dockerd directly over `DOCKER_HOST`'s unix socket
with aiohttp (no process per call): exec with demultiplexed output and exit code, tar archives in and out
of a container, and the lookups `arl.harbor.docker_environment` needs. Every request has a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp

from arl.harbor.errors import HarborError

# Control requests (inspect, create, list) answer within seconds even on a loaded daemon.
CONTROL_TIMEOUT_SEC = 120.0
# Archive transfers move a trial's tests / logs / artifacts: small, but allow for a slow disk.
ARCHIVE_TIMEOUT_SEC = 600.0
# An exec without a caller timeout still ends: Harbor's agent and verifier timeouts are far shorter.
EXEC_MAX_SEC = 6 * 3600.0

OutputSink = Callable[[str], Awaitable[None]]


class DockerEngineError(HarborError, RuntimeError):
    """The Docker Engine API answered with an error status (or not at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ArchiveTooLargeError(DockerEngineError):
    """A container's archive grew past the size the caller allowed (the download stopped there)."""


def engine_socket_path() -> str | None:
    """The daemon's unix socket from `DOCKER_HOST` (default /var/run/docker.sock), or None when the
    CLI would talk to something else (tcp/ssh host, a docker context) and only the CLI knows how."""
    if os.environ.get("DOCKER_CONTEXT", "default") != "default":
        return None
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        path = "/var/run/docker.sock"
    elif host.startswith("unix://"):
        path = host.removeprefix("unix://")
    else:
        return None
    return path if Path(path).is_socket() else None


class DockerEngine:
    """One aiohttp session on the daemon's unix socket; `close()` it when done (open lazily)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # force_close: exec/start hijacks its connection, so connections are not reused.
            connector = aiohttp.UnixConnector(path=self.socket_path, force_close=True)
            self._session = aiohttp.ClientSession(connector=connector, base_url="http://docker")
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @contextlib.asynccontextmanager
    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        data: bytes | None = None,
        timeout_sec: float = CONTROL_TIMEOUT_SEC,
        ok: Sequence[int] = (200, 201, 204),
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The daemon's response with a status in `ok` (DockerEngineError naming the call otherwise, or when
        the daemon does not answer within `timeout_sec`, reading included)."""
        headers = {"Content-Type": "application/x-tar"} if data is not None else None
        try:
            async with self._http().request(
                method,
                path,
                params=params,
                json=body,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_sec),
            ) as resp:
                if resp.status not in ok:
                    detail = (await resp.read()).decode(errors="replace").strip()
                    try:
                        detail = json.loads(detail).get("message", detail)
                    except (ValueError, AttributeError):
                        pass
                    raise DockerEngineError(f"{method} {path}: {resp.status} {detail[:500]}", resp.status)
                yield resp
        except TimeoutError:
            raise DockerEngineError(
                f"{method} {path}: no answer from dockerd within {timeout_sec:.0f}s"
            ) from None
        except aiohttp.ClientError as e:
            raise DockerEngineError(f"{method} {path}: {type(e).__name__}: {e}") from e

    async def _call(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes, dict[str, str]]:
        async with self._request(method, path, **kwargs) as resp:
            return resp.status, await resp.read(), dict(resp.headers)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, payload, _ = await self._call(method, path, **kwargs)
        return json.loads(payload) if payload else None

    # -- lookups ---------------------------------------------------------------------------------

    async def containers(self, labels: Sequence[str], *, all_states: bool = True) -> list[dict[str, Any]]:
        """The containers carrying every label in `labels` (`key=value`)."""
        params = {"filters": json.dumps({"label": list(labels)}), "all": "1" if all_states else "0"}
        return await self._json("GET", "/containers/json", params=params)

    async def networks(self, labels: Sequence[str]) -> list[dict[str, Any]]:
        """The networks carrying every label in `labels` (`key=value`)."""
        return await self._json("GET", "/networks", params={"filters": json.dumps({"label": list(labels)})})

    async def info(self) -> dict[str, Any]:
        return await self._json("GET", "/info")

    async def remove_container(self, container: str) -> None:
        """Kill and remove the container with its anonymous volumes (gone already: nothing to do)."""
        await self._call(
            "DELETE", f"/containers/{container}", params={"force": "1", "v": "1"}, ok=(200, 204, 404)
        )

    async def remove_network(self, network: str) -> None:
        """Remove the network (gone already: nothing to do)."""
        await self._call("DELETE", f"/networks/{network}", ok=(200, 204, 404))

    async def inspect(self, container: str) -> dict[str, Any] | None:
        """The container's inspect document, None when it no longer exists."""
        try:
            return await self._json("GET", f"/containers/{container}/json")
        except DockerEngineError as e:
            if e.status == 404:
                return None
            raise

    async def processes(self, container: str) -> list[tuple[int, int, str]]:
        """(pid, ppid, command line) of every process of a running container, in the host's PID namespace."""
        data = await self._json("GET", f"/containers/{container}/top", params={"ps_args": "-o pid,ppid,args"})
        titles = [t.upper() for t in data.get("Titles") or []]
        pid, ppid, command = titles.index("PID"), titles.index("PPID"), len(titles) - 1
        return [
            (int(row[pid]), int(row[ppid]), " ".join(row[command:])) for row in data.get("Processes") or []
        ]

    # -- exec ------------------------------------------------------------------------------------

    async def exec(
        self,
        container: str,
        argv: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: float | None = None,
        on_output: OutputSink | None = None,
    ) -> tuple[int, bytes]:
        """Run `argv` in the running `container` as `docker exec` does (no TTY, no stdin).

        Returns (exit code, stdout and stderr interleaved as written). Raises TimeoutError after
        `timeout_sec` (the process is left to the container's teardown, as with the CLI). `on_output`
        gets each complete line as it arrives (and a final unterminated one).
        """
        config: dict[str, Any] = {"Cmd": list(argv), "AttachStdout": True, "AttachStderr": True, "Tty": False}
        if user is not None:
            config["User"] = user
        if workdir:
            config["WorkingDir"] = workdir
        if env:
            config["Env"] = [f"{k}={v}" for k, v in env.items()]
        created = await self._json("POST", f"/containers/{container}/exec", body=config)
        exec_id = created["Id"]
        output = bytearray()
        limit = timeout_sec if timeout_sec else EXEC_MAX_SEC
        async with asyncio.timeout(limit):
            await self._stream_exec(exec_id, output, on_output)
        # The stream ends when the process's outputs close; its exit code follows at once.
        for _ in range(50):
            state = await self._json("GET", f"/exec/{exec_id}/json")
            if not state.get("Running") and state.get("ExitCode") is not None:
                return int(state["ExitCode"]), bytes(output)
            await asyncio.sleep(0.1)
        raise DockerEngineError(
            f"exec {exec_id[:12]} in {container[:12]}: no exit code 5 s after its output ended"
        )

    async def _stream_exec(self, exec_id: str, output: bytearray, on_output: OutputSink | None) -> None:
        pending = bytearray()
        try:
            async with self._http().post(
                f"/exec/{exec_id}/start",
                json={"Detach": False, "Tty": False},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONTROL_TIMEOUT_SEC),
            ) as resp:
                if resp.status != 200:
                    detail = (await resp.read()).decode(errors="replace")
                    raise DockerEngineError(
                        f"exec start {exec_id[:12]}: {resp.status} {detail[:500]}", resp.status
                    )
                # Multiplexed frames: 1 byte stream (1 stdout, 2 stderr), 3 zero bytes, 4 bytes size.
                while True:
                    try:
                        header = await resp.content.readexactly(8)
                    except asyncio.IncompleteReadError as e:
                        if e.partial:
                            raise DockerEngineError(f"exec {exec_id[:12]}: truncated frame header") from None
                        break
                    (size,) = struct.unpack(">I", header[4:])
                    chunk = await resp.content.readexactly(size) if size else b""
                    output += chunk
                    if on_output is not None:
                        pending += chunk
                        while (end := pending.find(b"\n")) != -1:
                            await on_output(pending[: end + 1].decode(errors="replace"))
                            del pending[: end + 1]
        except aiohttp.ClientError as e:
            raise DockerEngineError(f"exec {exec_id[:12]}: {type(e).__name__}: {e}") from e
        if on_output is not None and pending:
            await on_output(pending.decode(errors="replace"))

    # -- archives --------------------------------------------------------------------------------

    async def path_stat(self, container: str, path: str) -> dict[str, Any] | None:
        """`{"name", "size", "mode", ...}` of `path` in the container (links followed), None if absent."""
        try:
            _, _, headers = await self._call(
                "HEAD", f"/containers/{container}/archive", params={"path": path}
            )
        except DockerEngineError as e:
            if e.status == 404:
                return None
            raise
        stat = headers.get("X-Docker-Container-Path-Stat")
        return json.loads(base64.b64decode(stat)) if stat else None

    async def put_archive(self, container: str, directory: str, tar_bytes: bytes) -> None:
        """Extract a tar into an existing `directory` of the container (DockerEngineError 404 if absent)."""
        await self._call(
            "PUT",
            f"/containers/{container}/archive",
            params={"path": directory},
            data=tar_bytes,
            timeout_sec=ARCHIVE_TIMEOUT_SEC,
        )

    async def get_archive(self, container: str, path: str) -> bytes:
        """A tar of `path` in the container, its top entry named after the path's last component."""
        _, payload, _ = await self._call(
            "GET", f"/containers/{container}/archive", params={"path": path}, timeout_sec=ARCHIVE_TIMEOUT_SEC
        )
        return payload

    async def get_archive_into(
        self, container: str, path: str, out: BinaryIO, *, max_bytes: int | None = None
    ) -> int:
        """`get_archive` streamed into `out` (a file: the tree never sits in memory); the bytes written.
        Raises ArchiveTooLargeError once the archive passes `max_bytes`."""
        written = 0
        async with self._request(
            "GET", f"/containers/{container}/archive", params={"path": path}, timeout_sec=ARCHIVE_TIMEOUT_SEC
        ) as resp:
            async for chunk in resp.content.iter_chunked(1 << 20):
                written += len(chunk)
                if max_bytes is not None and written > max_bytes:
                    raise ArchiveTooLargeError(f"the archive of {path} passed {max_bytes} bytes")
                await asyncio.to_thread(out.write, chunk)
        return written
