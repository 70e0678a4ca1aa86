"""`MessageQueue`: the bounded FIFO of samples between the rollout side and the trainer (asyncio core).

Producers `put` samples; a full queue makes them wait (backpressure) until space frees up or their
timeout passes, in which case `put` returns False and the caller still holds the sample: nothing is
dropped silently. The optional "drop_oldest" policy evicts instead, and counts what it evicted.
Consumers `get` one sample or `get_batch` several. `close()` wakes every waiter: later puts raise
`QueueClosedError`, gets drain what is left and then return None.

All methods must be called from the event loop that runs the queue (one loop, no threads); waiting
uses futures that `close()` and every put/get resolve, so no task is ever left behind.

With `persist_dir` the queue can `snapshot()` its samples (and does so on `close()`), and a queue
constructed over the same directory (or `MessageQueue.restore(dir)`) starts with them again.
Delivery across a restart is at-least-once: samples consumed after the last snapshot come back.

The queue never looks inside its items: with `encoded=True` it holds `encode_sample` bytes (the Ray
actor's queue: samples pass through it without being decoded), snapshots them as they are and restores
them as bytes.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from pathlib import Path

from arl.queue.errors import QueueClosedError, QueueFullError
from arl.queue.persistence import (
    encode_snapshot,
    read_snapshot,
    read_snapshot_encoded,
    write_snapshot,
    write_snapshot_bytes,
)
from arl.queue.types import OverflowPolicy, QueueStats, Sample


class _Waiters:
    """A set of futures woken all at once when the queue changes (a lock-free asyncio condition)."""

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    async def wait(self, timeout: float | None) -> bool:
        """Wait for the next `notify_all` or `timeout` seconds; False when the timeout passed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            try:
                self._futures.remove(fut)
            except ValueError:
                pass

    def notify_all(self) -> None:
        """Wake every waiter (each re-checks its own condition)."""
        futures, self._futures = self._futures, []
        for fut in futures:
            if not fut.done():
                fut.set_result(None)


class MessageQueue[ItemT: (Sample, bytes)]:
    """A bounded FIFO of `Sample`s (or their `encode_sample` bytes, with `encoded=True`) with blocking put,
    timed get, batches, close and persistence."""

    def __init__(
        self,
        max_size: int,
        *,
        overflow: OverflowPolicy = "block",
        persist_dir: str | os.PathLike[str] | None = None,
        restore: bool = True,
        encoded: bool = False,
    ) -> None:
        """Create a queue holding at most `max_size` samples.

        With `persist_dir`, `snapshot()` writes there and, if `restore` is true and a snapshot exists,
        the queue starts with its samples (all of them, even beyond `max_size`: puts then wait until
        consumers bring the size under the bound). A corrupt snapshot raises `CorruptSnapshotError`.
        With `encoded`, items are `encode_sample` bytes (restored ones re-encoded to the current schema);
        the caller checks what it puts (`codec.read_header`).
        """
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if overflow not in ("block", "drop_oldest"):
            raise ValueError(f"overflow must be 'block' or 'drop_oldest', got {overflow!r}")
        self._max_size = max_size
        self._overflow: OverflowPolicy = overflow
        self._persist_dir = Path(persist_dir) if persist_dir is not None else None
        self._items: deque[ItemT] = deque()
        self._closed = False
        self._not_empty = _Waiters()
        self._not_full = _Waiters()
        self._total_put = 0
        self._total_got = 0
        self._dropped = 0
        self._put_timeouts = 0
        self._peak = 0
        self._restored = 0
        if self._persist_dir is not None and restore:
            restored = (
                read_snapshot_encoded(self._persist_dir) if encoded else read_snapshot(self._persist_dir)
            )
            self._items.extend(restored)  # type: ignore[arg-type]
            self._restored = len(restored)
            self._total_put = len(restored)
            self._peak = len(restored)

    @classmethod
    def restore(
        cls,
        persist_dir: str | os.PathLike[str],
        max_size: int,
        *,
        overflow: OverflowPolicy = "block",
        encoded: bool = False,
    ) -> MessageQueue[ItemT]:
        """A queue over `persist_dir` that starts with the samples of its snapshot (if any)."""
        return cls(max_size, overflow=overflow, persist_dir=persist_dir, restore=True, encoded=encoded)

    # ----- state -----

    @property
    def max_size(self) -> int:
        """The capacity given at construction."""
        return self._max_size

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._closed

    @property
    def persist_dir(self) -> Path | None:
        """Where snapshots go, if anywhere."""
        return self._persist_dir

    def size(self) -> int:
        """Number of samples queued now."""
        return len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        """True when a put would have to wait (or evict)."""
        return len(self._items) >= self._max_size

    def empty(self) -> bool:
        """True when no sample is queued."""
        return not self._items

    def stats(self) -> QueueStats:
        """Counters since construction."""
        return QueueStats(
            size=len(self._items),
            max_size=self._max_size,
            peak_size=self._peak,
            total_put=self._total_put,
            total_got=self._total_got,
            dropped=self._dropped,
            put_timeouts=self._put_timeouts,
            restored=self._restored,
            closed=self._closed,
        )

    # ----- producers -----

    async def put(self, sample: ItemT, timeout: float | None = None, *, count_timeout: bool = True) -> bool:
        """Append `sample`, waiting while the queue is full.

        Returns True once queued, False if `timeout` seconds passed first (the sample was NOT queued).
        Raises `QueueClosedError` if the queue is or becomes closed before the sample is queued.
        With the "drop_oldest" policy it never waits: the oldest sample is evicted instead.
        `count_timeout=False` keeps a timeout out of `stats().put_timeouts` (for a caller that retries).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(0.0, timeout)
        while True:
            if self._closed:
                raise QueueClosedError("put on a closed queue")
            if not self.full() or self._overflow == "drop_oldest":
                self._append(sample)
                return True
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                if count_timeout:
                    self._put_timeouts += 1
                return False
            await self._not_full.wait(remaining)

    def put_nowait(self, sample: ItemT) -> None:
        """Append `sample` without waiting.

        Raises `QueueFullError` when full under the "block" policy (evicts under "drop_oldest"),
        `QueueClosedError` when closed.
        """
        if self._closed:
            raise QueueClosedError("put on a closed queue")
        if self.full() and self._overflow == "block":
            raise QueueFullError(f"queue full ({self._max_size} samples)")
        self._append(sample)

    def _append(self, sample: ItemT) -> None:
        while self._overflow == "drop_oldest" and len(self._items) >= self._max_size:
            self._items.popleft()
            self._dropped += 1
        self._items.append(sample)
        self._total_put += 1
        self._peak = max(self._peak, len(self._items))
        self._not_empty.notify_all()

    # ----- consumers -----

    async def get(self, timeout: float | None = None) -> ItemT | None:
        """The oldest sample, waiting up to `timeout` seconds (None: forever) for one.

        Returns None on timeout, or when the queue is closed and drained (see `closed`).
        """
        batch = await self.get_batch(1, timeout)
        return batch[0] if batch else None

    def get_nowait(self) -> ItemT | None:
        """The oldest sample if any is queued, else None."""
        return self._take(1)[0] if self._items else None

    async def get_batch(self, n: int, timeout: float | None = None, *, partial: bool = True) -> list[ItemT]:
        """The `n` oldest samples, in order, waiting up to `timeout` seconds for `n` to be queued.

        Returns fewer than `n` (possibly none) when the timeout passes or the queue is closed first;
        what it returns is taken off the queue, what it does not return stays there. An `n` above
        `max_size` waits for a full queue, then takes what is there. With `partial=False` a timeout
        takes nothing and returns [] (a closed queue still hands out its remainder).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(0.0, timeout)
        want = min(n, self._max_size)
        while len(self._items) < want and not self._closed:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                if not partial:
                    return []
                break
            await self._not_empty.wait(remaining)
        return self._take(n)

    def _take(self, n: int) -> list[ItemT]:
        k = min(n, len(self._items))
        out = [self._items.popleft() for _ in range(k)]
        if out:
            self._total_got += len(out)
            self._not_full.notify_all()
        return out

    # ----- lifecycle -----

    def close(self, *, snapshot: bool = True) -> None:
        """Close the queue and wake every waiter; idempotent.

        Blocked and later puts raise `QueueClosedError`; gets return what is left, then None.
        With `persist_dir` and `snapshot` true, the samples still queued are written first.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if snapshot and self._persist_dir is not None:
                self.snapshot()
        finally:
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def snapshot(self) -> Path:
        """Write the queued samples (in order) to `persist_dir` atomically; returns the file.

        Blocking file I/O on the calling thread: the queue's content at the call is what gets written.
        """
        if self._persist_dir is None:
            raise ValueError("snapshot() needs a queue created with persist_dir")
        return write_snapshot(self._persist_dir, list(self._items))

    async def snapshot_async(self) -> Path:
        """Like `snapshot()`, but the file is written on a worker thread (encoding stays on the loop)."""
        if self._persist_dir is None:
            raise ValueError("snapshot_async() needs a queue created with persist_dir")
        payload = encode_snapshot(list(self._items))
        return await asyncio.to_thread(write_snapshot_bytes, self._persist_dir, payload)

    def drain_nowait(self) -> list[ItemT]:
        """Take every queued sample at once (e.g. to hand them elsewhere on shutdown)."""
        return self._take(len(self._items)) if self._items else []
