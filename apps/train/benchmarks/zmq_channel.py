"""A small ZeroMQ request channel between a trainer process and a rollout process (no Ray).

The rollout process serves the requests (`RolloutServer`); the trainer process holds a `RolloutClient`,
which implements the trainer's two seams over it:

- `SampleSource` (`get_batch(n, timeout)`, `size()`): samples cross as msgspec-encoded `arl.queue`
  Samples (`encode_sample` / `decode_sample`), taken off the rollout process's `MessageQueue`;
- `RolloutControl` (`pause()`, `update_weights(address, config_json, version)`, `resume(queued)`):
  forwarded to the `Rollouter`.

Requests are `[id, method, args]` msgpack frames on a DEALER socket; the ROUTER side handles each in
its own task (so `update_weights` runs while the trainer's sender thread is sending) and answers
`[id, ok, result_or_error]`. Every call has a timeout.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from arl.queue.codec import decode_sample, encode_sample
from arl.queue.types import Sample

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


class RemoteError(RuntimeError):
    """The rollout process answered a request with an error."""


class RolloutClient:
    """The trainer side: `SampleSource` + `RolloutControl` over one DEALER socket."""

    def __init__(self, address: str, *, rpc_timeout_s: float = 600.0) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._rpc_timeout_s = rpc_timeout_s

    async def _read(self) -> None:
        while True:
            frame = await self._sock.recv()
            rid, ok, result = _dec.decode(frame)
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                if ok:
                    fut.set_result(result)
                else:
                    fut.set_exception(RemoteError(result))

    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        await self._sock.send(_enc.encode([rid, method, list(args)]))
        try:
            return await asyncio.wait_for(fut, self._rpc_timeout_s if timeout is None else timeout)
        finally:
            self._pending.pop(rid, None)

    # ---- SampleSource
    async def get_batch(self, n: int, timeout: float | None = None) -> list[Sample]:
        wait = 30.0 if timeout is None else min(timeout, 30.0)  # the trainer loops until its own deadline
        frames = await self.call("get_batch", n, wait, timeout=wait + 30.0)
        return [decode_sample(f, where="rollout process") for f in frames]

    async def size(self) -> int:
        return int(await self.call("size"))

    # ---- RolloutControl
    async def pause(self) -> None:
        await self.call("pause")

    async def update_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        await self.call("update_weights", sync_address, sync_config_json, version)

    async def resume(self, queued_samples: int) -> None:
        await self.call("resume", queued_samples)

    # ---- the benchmark's extras
    async def stats(self) -> dict[str, Any]:
        return await self.call("stats")

    async def stop(self) -> None:
        try:
            await self.call("stop", timeout=60.0)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
            self._reader = None
        self._sock.close(0)
        self._ctx.term()


class RolloutServer:
    """The rollout side: answers the client's requests from `handlers` (async callables)."""

    def __init__(self, address: str, handlers: dict[str, Callable[..., Awaitable[Any]]]) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.bind(address)
        self._handlers = handlers
        self._send_lock = asyncio.Lock()
        self.stopped = asyncio.Event()

    async def _answer(self, ident: bytes, rid: int, method: str, args: list[Any]) -> None:
        try:
            handler = self._handlers[method]
            result, ok = await handler(*args), True
        except Exception as e:  # report it to the trainer, which raises
            result, ok = f"{method}: {type(e).__name__}: {e}", False
        async with self._send_lock:
            await self._sock.send_multipart([ident, _enc.encode([rid, ok, result])])
        if method == "stop":
            self.stopped.set()

    async def serve(self) -> None:
        """Answer requests until a "stop" request was answered."""
        async with asyncio.TaskGroup() as group:
            while not self.stopped.is_set():
                try:
                    ident, frame = await asyncio.wait_for(self._sock.recv_multipart(), 0.5)
                except TimeoutError:
                    continue
                rid, method, args = _dec.decode(frame)
                group.create_task(self._answer(ident, rid, method, args))

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()


def encode_samples(samples: list[Sample]) -> list[bytes]:
    return [encode_sample(s) for s in samples]
