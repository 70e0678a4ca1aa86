"""Publishing the trainer's weights through arl-sync, and the rollout side's part of a sync.

`RolloutControl` is what the trainer needs from the rollout side (the app binds it to the
Rollouter actor): pause generation, load weights from our sender's address, resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

import msgspec
import torch

from arl.sync import SyncConfig, SyncStats, WeightSender


class RolloutControl(Protocol):
    async def pause(self) -> None: ...

    async def update_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None: ...

    async def resume(self, queued_samples: int) -> None: ...


class WeightPublisher:
    """Owns the arl-sync sender (built once, reused for every sync)."""

    def __init__(self, config: SyncConfig, *, num_receivers: int, host: str = "127.0.0.1") -> None:
        self.config = config
        self.sender = WeightSender(config, num_receivers=num_receivers, host=host)
        self.config_json = msgspec.json.encode(config)

    @property
    def address(self) -> str:
        return self.sender.address

    async def publish(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, rollout: RolloutControl
    ) -> SyncStats:
        """Send `named_tensors` as `version` while the rollout side receives them (both sides concurrently)."""
        send = asyncio.ensure_future(asyncio.to_thread(self.sender.send, named_tensors, version))
        try:
            await rollout.update_weights(self.address, self.config_json, version)
        except BaseException:
            # The receiving side failed (e.g. a replica died): stop the sender now rather than let it
            # wait out sync.timeout_s for receivers that will never answer; the rollout's error is the cause.
            self.sender.cancel()
            await asyncio.gather(send, return_exceptions=True)
            raise
        return await send

    def close(self) -> None:
        self.sender.close()
