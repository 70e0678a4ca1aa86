"""Asyncio on virtual time, for simulating hours of engine time in seconds (apps/bench's simulator).

`VirtualClockLoop` is an event loop whose clock jumps to the next timer whenever nothing is ready;
`virtual_time` points modules' `time` at it so their metrics read virtual seconds; a simulation where
every task waits with no timer pending raises `SimulationDeadlock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Iterator
from typing import Any


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: whenever nothing is ready, time jumps to the next timer.

    `asyncio.sleep`, `wait_for` timeouts and `loop.time()` all run on it, so a simulation of hours
    of engine time takes as long as its Python work. Threads and real I/O do not fit (nothing wakes
    the loop but timers): simulated parts must only await timers and each other. When every task is
    blocked with no timer pending, the simulation is deadlocked and `run_until_complete` raises.
    """

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_InstantSelector(self))

    def time(self) -> float:
        return self._virtual_now


@contextlib.contextmanager
def virtual_time(loop: asyncio.AbstractEventLoop, *modules: Any) -> Iterator[None]:
    """Within the block, `modules`' `time.perf_counter/monotonic/time` read `loop.time()`.

    The rollouter and trainer stamp metrics with the `time` module; a simulation on a
    `VirtualClockLoop` points those modules' `time` at the virtual clock so their figures
    (step_s, samples_per_s, wait_s) are in virtual seconds.
    """
    fake = types.SimpleNamespace(perf_counter=loop.time, monotonic=loop.time, time=loop.time, sleep=None)
    saved = [(m, m.time) for m in modules]
    for m in modules:
        m.time = fake
    try:
        yield
    finally:
        for m, original in saved:
            m.time = original


class SimulationDeadlock(RuntimeError):
    """Every simulated task waits on another and no timer is pending."""


class _InstantSelector:
    """Selector whose `select(timeout)` advances the virtual clock by `timeout` instead of waiting."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        import selectors

        self._loop = loop
        self._real = selectors.DefaultSelector()  # only holds the loop's self-pipe registration

    def register(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> Any:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> Any:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise SimulationDeadlock("every simulated task is blocked and no timer is pending")
        self._loop._virtual_now += max(0.0, timeout)
        return []
