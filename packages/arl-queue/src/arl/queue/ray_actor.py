"""The queue as a Ray actor, and the client that producers and consumers use to talk to it.

`MessageQueueActor` holds a `MessageQueue` inside an async Ray actor; samples cross the actor boundary
as `codec.encode_sample` bytes (msgpack), never pickled, and stay bytes inside it: the actor reads only
their `schema_version` (`codec.read_header`) and hands the same bytes to the consumer. `QueueClient`
wraps an actor handle with the same async API as the local queue, encoding (and checking) on the
producer's side and decoding once, on the consumer's.

Ray is an optional dependency of arl-queue: it is imported here only inside the functions that need
it, so `import arl.queue` (and this module) works without Ray installed.

Every remote await carries a timeout. A put or get that may wait long (`timeout=None`) is split into
remote calls of at most `poll_interval` seconds each, none of which moves a sample unless it succeeds
(gets ask the actor for all-or-nothing batches until the caller's deadline), so giving up in between
never loses a sample. Cancelling a call while a remote get is in flight can lose what it was taking:
prefer timeouts to cancellation for consumers.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Awaitable
from typing import Any, TypeVar

import msgspec

from arl.queue.codec import decode_sample, encode_sample, read_header
from arl.queue.errors import QueueActorError, QueueError
from arl.queue.queue import MessageQueue
from arl.queue.types import OverflowPolicy, QueueStats, Sample

T = TypeVar("T")


def _ray() -> Any:
    """Ray, imported on first use: it is an optional dependency of arl-queue."""
    return importlib.import_module("ray")


class MessageQueueActor:
    """A `MessageQueue` served from a Ray actor; create it with `create_queue_actor`.

    A plain class: `create_queue_actor` wraps it with `ray.remote`. Its methods take and return
    encoded sample bytes, which it stores without decoding (their schema version is checked on put).
    `get_batch` also reports whether the queue is exhausted (closed and empty).
    """

    def __init__(
        self,
        max_size: int,
        overflow: OverflowPolicy = "block",
        persist_dir: str | None = None,
        restore: bool = True,
    ) -> None:
        self._queue: MessageQueue[bytes] = MessageQueue(
            max_size, overflow=overflow, persist_dir=persist_dir, restore=restore, encoded=True
        )

    async def put(self, data: bytes, timeout: float | None = None, count_timeout: bool = True) -> bool:
        """Put one encoded sample (its schema version checked, the rest kept as is); False on timeout."""
        read_header(data)
        return await self._queue.put(bytes(data), timeout, count_timeout=count_timeout)

    async def put_nowait(self, data: bytes) -> None:
        """Put one encoded sample without waiting (raises `QueueFullError` when full)."""
        read_header(data)
        self._queue.put_nowait(bytes(data))

    async def get_batch(
        self, n: int, timeout: float | None = None, partial: bool = True
    ) -> tuple[list[bytes], bool]:
        """Up to `n` encoded samples (see `MessageQueue.get_batch`) and whether the queue is exhausted."""
        items = await self._queue.get_batch(n, timeout, partial=partial)
        exhausted = self._queue.closed and self._queue.empty()
        return items, exhausted

    async def size(self) -> int:
        """Samples queued now."""
        return self._queue.size()

    async def stats(self) -> bytes:
        """`QueueStats`, msgpack-encoded."""
        return msgspec.msgpack.encode(self._queue.stats())

    async def close(self, snapshot: bool = True) -> None:
        """Close the queue (snapshotting first when it persists; see `MessageQueue.close`)."""
        was_closed = self._queue.closed
        self._queue.close(snapshot=False)
        if snapshot and not was_closed and self._queue.persist_dir is not None:
            await self._queue.snapshot_async()

    async def snapshot(self) -> str:
        """Persist the queued samples; returns the snapshot file's path."""
        return str(await self._queue.snapshot_async())


def create_queue_actor(
    max_size: int,
    name: str | None = None,
    persist_dir: str | os.PathLike[str] | None = None,
    *,
    overflow: OverflowPolicy = "block",
    restore: bool = True,
    namespace: str | None = None,
    get_if_exists: bool = False,
    detached: bool = False,
    max_concurrency: int = 1000,
    num_cpus: float = 0,
    scheduling_strategy: Any = None,
) -> Any:
    """Start a `MessageQueueActor` on the connected Ray cluster and return its handle.

    `name` (and `namespace`) make it findable with `ray.get_actor`; `detached` keeps it alive after
    the driver exits. `max_concurrency` bounds how many calls (waiting puts and gets included) it
    serves at once. It asks for `num_cpus` CPUs (0: it is I/O-bound and should not hold a core).
    `scheduling_strategy` is Ray's (e.g. a `NodeAffinitySchedulingStrategy`: the node whose disk holds
    `persist_dir`); None: Ray's default.
    """
    ray = _ray()

    options: dict[str, Any] = {"max_concurrency": max_concurrency, "num_cpus": num_cpus}
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    if name is not None:
        options["name"] = name
        options["get_if_exists"] = get_if_exists
    if namespace is not None:
        options["namespace"] = namespace
    if detached:
        options["lifetime"] = "detached"
    actor_cls = ray.remote(MessageQueueActor)
    return actor_cls.options(**options).remote(
        max_size, overflow, None if persist_dir is None else os.fspath(persist_dir), restore
    )


class QueueClient:
    """The async API of `MessageQueue`, spoken to a `MessageQueueActor` through its Ray handle."""

    def __init__(self, handle: Any, *, rpc_timeout: float = 60.0, poll_interval: float = 5.0) -> None:
        """Wrap `handle`. `rpc_timeout` is how long a call may take beyond its own wait before the
        actor counts as unreachable (`QueueActorError`); `poll_interval` bounds each remote wait."""
        if rpc_timeout <= 0 or poll_interval <= 0:
            raise ValueError("rpc_timeout and poll_interval must be > 0")
        self._handle = handle
        self._rpc_timeout = rpc_timeout
        self._poll = poll_interval

    @classmethod
    def from_name(cls, name: str, namespace: str | None = None, **kwargs: Any) -> QueueClient:
        """A client of the named queue actor (see `create_queue_actor(name=...)`)."""
        ray = _ray()

        return cls(ray.get_actor(name, namespace=namespace), **kwargs)

    @property
    def handle(self) -> Any:
        """The actor handle (pass it to other Ray tasks; wrap it again there)."""
        return self._handle

    async def put(self, sample: Sample, timeout: float | None = None) -> bool:
        """Put `sample`, waiting up to `timeout` seconds (None: forever) while the queue is full.

        True once queued; False on timeout (not queued). Raises `QueueClosedError` when closed.
        """
        data = encode_sample(sample)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(0.0, timeout)
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            wait = self._poll if remaining is None else min(self._poll, remaining)
            last = remaining is not None and remaining <= self._poll
            ok = await self._call(self._handle.put.remote(data, wait, last), wait)
            if ok:
                return True
            if last:
                return False

    async def put_nowait(self, sample: Sample) -> None:
        """Put `sample` without waiting; raises `QueueFullError` when full."""
        await self._call(self._handle.put_nowait.remote(encode_sample(sample)), 0.0)

    async def get(self, timeout: float | None = None) -> Sample | None:
        """The oldest sample, waiting up to `timeout` seconds; None on timeout or closed and drained."""
        batch = await self.get_batch(1, timeout)
        return batch[0] if batch else None

    async def get_batch(self, n: int, timeout: float | None = None) -> list[Sample]:
        """Up to `n` oldest samples in order (see `MessageQueue.get_batch`)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(0.0, timeout)
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            wait = self._poll if remaining is None else min(self._poll, remaining)
            last = remaining is not None and remaining <= self._poll
            items, exhausted = await self._call(self._handle.get_batch.remote(n, wait, last), wait)
            if items or exhausted or last:
                return [decode_sample(b) for b in items]

    async def size(self) -> int:
        """Samples queued now."""
        return await self._call(self._handle.size.remote(), 0.0)

    async def stats(self) -> QueueStats:
        """The queue's counters."""
        raw = await self._call(self._handle.stats.remote(), 0.0)
        return msgspec.msgpack.decode(raw, type=QueueStats)

    async def close(self, snapshot: bool = True) -> None:
        """Close the queue (see `MessageQueue.close`)."""
        await self._call(self._handle.close.remote(snapshot), 0.0)

    async def snapshot(self) -> str:
        """Persist the queued samples on the actor's host; returns the file's path there."""
        return await self._call(self._handle.snapshot.remote(), 0.0)

    async def _call(self, ref: Awaitable[T], wait: float) -> T:
        """Await a remote call for `wait` + rpc_timeout seconds, unwrapping the queue's own errors."""
        ray = _ray()

        try:
            async with asyncio.timeout(wait + self._rpc_timeout):
                return await ref
        except TimeoutError as exc:
            raise QueueActorError(
                f"queue actor did not answer within {wait + self._rpc_timeout:.1f}s"
            ) from exc
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, QueueError):
                raise cause from None
            raise
        except ray.exceptions.RayActorError as exc:
            raise QueueActorError(f"queue actor is unavailable: {exc}") from exc
