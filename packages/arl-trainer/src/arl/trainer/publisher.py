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

    async def update_weights(
        self, sync_address: str | list[str], sync_config_json: bytes, version: int
    ) -> None:
        """Load `version` from the sender at `sync_address`, or replica i from `sync_address[i]`."""

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

    def expect_receivers(self, n: int) -> None:
        """The next sync has `n` receivers (a dead replica's workers skip it)."""
        self.sender.num_receivers = n

    async def publish(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int,
        rollout: RolloutControl,
        replica_addresses: list[str] | None = None,
    ) -> SyncStats:
        """Send `named_tensors` as `version` while the rollout side receives them (both sides concurrently).

        The rollout side is told this sender's address, or `replica_addresses` (one per replica) when
        other senders serve some replicas. If the sync fails, the rest of `named_tensors` is still
        iterated: under FSDP2 every item is a collective gather the other ranks are waiting in.
        """
        send = asyncio.ensure_future(asyncio.to_thread(self.sender.send, named_tensors, version))
        try:
            await rollout.update_weights(replica_addresses or self.address, self.config_json, version)
        except BaseException:
            # The receiving side failed (e.g. a replica died): stop the sender now rather than let it
            # wait out sync.timeout_s for receivers that will never answer; the rollout's error is the cause.
            self.sender.cancel()
            await asyncio.gather(send, return_exceptions=True)
            finish_stream(named_tensors)
            raise
        try:
            return await send
        except BaseException:
            finish_stream(named_tensors)
            raise

    def close(self) -> None:
        self.sender.close()


def finish_stream(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run a partly consumed stream of weights to its end (a list or other re-iterable is left alone).

    A stream gathered from FSDP2 shards is a sequence of collectives: a rank whose send failed half
    way must still take part in the gathers left, or every other rank waits in one until its timeout.
    """
    if iter(named_tensors) is named_tensors:  # an iterator: the sender stopped somewhere inside it
        for _ in named_tensors:
            pass
