"""Noticing that an HTTP client went away while its turn is being generated, so the generation can be aborted.

aiohttp tells a handler nothing when its client disconnects (it cancels the handler only in servers run with
`handler_cancellation=True`, which `ChatProxy.start()` does not use and an embedding server may not); the
only sign is the request's transport becoming None or closing. `DisconnectWatcher` polls the transports of
the requests being generated from one task, one wake-up per `interval` for all of them, and resolves each
request's future once its client is gone.
"""

from __future__ import annotations

import asyncio

from aiohttp import web


def client_gone(request: web.BaseRequest) -> bool:
    """Whether the connection of `request` is closed or closing (nothing written to it can arrive)."""
    transport = request.transport
    return transport is None or transport.is_closing()


class DisconnectWatcher:
    """Futures that resolve when a watched request's client disconnects (polled every `interval` seconds)."""

    def __init__(self, interval: float = 0.1) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.interval = interval
        self._watched: dict[asyncio.Future[None], web.BaseRequest] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, request: web.BaseRequest) -> asyncio.Future[None]:
        """A future that resolves once the client of `request` is gone; pass it to `unwatch` when done."""
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()
        self._watched[gone] = request
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="arl-proxy-disconnect-watcher")
        return gone

    def unwatch(self, gone: asyncio.Future[None]) -> None:
        self._watched.pop(gone, None)
        if not gone.done():
            gone.cancel()

    async def stop(self) -> None:
        """Stop polling (the watcher restarts on the next `watch`)."""
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while self._watched:
            await asyncio.sleep(self.interval)
            for gone, request in list(self._watched.items()):
                if client_gone(request):
                    del self._watched[gone]
                    if not gone.done():
                        gone.set_result(None)
