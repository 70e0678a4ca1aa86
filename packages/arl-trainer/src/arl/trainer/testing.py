"""Test doubles for arl-trainer that ship with the package: a simulated trainer for the virtual clock.

A simulation drives the real `Trainer` loop (batch assembly, staleness accounting, the sync
protocol) with doubles that cost time instead of doing work:

- `SimPolicy`: a policy backend whose `train_step` costs `tokens / train_tokens_per_s` seconds.
  `train_step` is synchronous in the real backend (the trainer's device is busy), and a synchronous
  call cannot let virtual time pass, so the cost is recorded in a `TrainerTimeline` and paid by the
  trainer's next await on the doubles below (the next `get_batch`, or the `pause` of the next sync):
  exactly when the real trainer would be free again.
- `SimSource` (wraps the sample queue), `SimRolloutControl` (wraps the rollouter) and `SimPublisher`
  (a weight sync of `sync_s` seconds that hands the new version to simulated engines) pay that debt.

Everything awaits only timers and the other simulated parts, so it runs on
`arl.rollout.testing.VirtualClockLoop` (or on real time, slowly).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from arl.trainer.batch import TrainBatch


class TrainerTimeline:
    """Trainer compute that has happened but whose time has not yet passed on the event loop."""

    def __init__(self) -> None:
        self.debt_s = 0.0
        self.train_s = 0.0  # total simulated compute (for the trainer's busy fraction)

    def charge(self, seconds: float) -> None:
        self.debt_s += seconds
        self.train_s += seconds

    async def settle(self) -> None:
        """Let the recorded compute time pass (the trainer is busy until then)."""
        debt, self.debt_s = self.debt_s, 0.0
        if debt > 0:
            await asyncio.sleep(debt)


class SimPolicy:
    """A policy backend costing `tokens / train_tokens_per_s` per step (tokens = the batch's
    non-padding tokens, prompt and response; the old-logprob pass is part of the calibrated rate)."""

    def __init__(
        self, timeline: TrainerTimeline, *, train_tokens_per_s: float, step_overhead_s: float = 0.0
    ) -> None:
        if train_tokens_per_s <= 0:
            raise ValueError(f"train_tokens_per_s must be > 0, got {train_tokens_per_s}")
        self.timeline = timeline
        self.train_tokens_per_s = train_tokens_per_s
        self.step_overhead_s = step_overhead_s
        self.steps = 0
        self.tokens = 0

    def train_step(self, batch: TrainBatch, mini_batch_rows: int, routes: Any = None) -> dict[str, float]:
        tokens = int(batch.attention_mask.sum().item())
        self.tokens += tokens
        self.steps += 1
        self.timeline.charge(self.step_overhead_s + tokens / self.train_tokens_per_s)
        return {"loss": 0.0, "grad_norm": 0.0, "updates": 1.0, "train_tokens": float(tokens)}

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(())


class LocalSource:
    """An in-process asyncio `MessageQueue` as the trainer's `SampleSource` (the app uses the Ray actor's client)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    async def get_batch(self, n: int, timeout: float | None = None) -> list[Any]:
        return await self.queue.get_batch(n, timeout)

    async def size(self) -> int:
        return self.queue.size()


class SimSource(LocalSource):
    """`LocalSource` that settles the simulated compute before each batch."""

    def __init__(self, queue: Any, timeline: TrainerTimeline) -> None:
        super().__init__(queue)
        self.timeline = timeline

    async def get_batch(self, n: int, timeout: float | None = None) -> list[Any]:
        await self.timeline.settle()
        return await super().get_batch(n, timeout)


class SimRolloutControl:
    """`RolloutControl` over an in-process Rollouter; `resume_extra_s` models a colocated engine's
    wake-up (KV cache re-allocation) after the trainer used its GPU."""

    def __init__(self, rollouter: Any, timeline: TrainerTimeline, *, resume_extra_s: float = 0.0) -> None:
        self.rollouter = rollouter
        self.timeline = timeline
        self.resume_extra_s = resume_extra_s
        self.sync_s_total = 0.0  # pause → resume, compute excluded
        self.syncs = 0
        self._sync_started = 0.0

    async def pause(self) -> None:
        await self.timeline.settle()
        self._sync_started = asyncio.get_running_loop().time()
        await self.rollouter.pause()

    async def update_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        await self.rollouter.update_weights(sync_address, sync_config_json, version)

    async def resume(self, queued_samples: int) -> None:
        if self.resume_extra_s:
            await asyncio.sleep(self.resume_extra_s)
        await self.rollouter.resume(queued_samples)
        self.sync_s_total += asyncio.get_running_loop().time() - self._sync_started
        self.syncs += 1


class _SimSyncStats:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.gbps = 0.0


class SimPublisher:
    """A weight sync costing `sync_s` seconds; the rollout side receives the version (simulated
    engines take it through `update_weights`, which they implement without a transfer)."""

    def __init__(self, *, sync_s: float) -> None:
        self.sync_s = sync_s
        self.address = "sim://publisher"
        self.syncs = 0

    async def publish(
        self, named_tensors: Sequence[Any] | Iterator[Any], version: int, rollout: Any
    ) -> _SimSyncStats:
        await asyncio.sleep(self.sync_s)
        await rollout.update_weights(self.address, b"{}", version)
        self.syncs += 1
        return _SimSyncStats(self.sync_s)

    def close(self) -> None:
        pass
