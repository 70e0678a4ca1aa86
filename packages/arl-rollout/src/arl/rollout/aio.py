"""Small asyncio helpers shared by arl-rollout's engines and test doubles."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task[object] | None) -> None:
    """Cancel a background task and wait until it has stopped (no orphan left running)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
