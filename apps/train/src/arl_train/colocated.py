"""Colocated mode (verl's synchronous hybrid engine): rollout and training take turns on the same GPUs.

One step: every replica generates the step's samples with the current weights; as soon as the trainer
holds them the replicas go to sleep (vLLM releases its KV cache and moves its weights to host memory,
`rollout.sleep_level`), the trainer runs its update on the freed GPU, the replicas wake their weight
memory, the new weights arrive (CUDA IPC: the trainer rank writes into each replica's staging buffer
on the shared GPU; with one replica per trainer GPU every rank feeds its own, see `arl.trainer.group`),
the KV cache comes back and generation resumes for the next step. With `actor.optimizer_offload`, the
AdamW state's way out to host memory runs beside the weight wake and the transfer, and the trainer
(every rank of an FSDP group) frees its memory just before the KV cache wakes (`settle_trainer_memory`).

`placement.resolve` makes colocated runs synchronous (staleness 0, one sync per step, no partial
rollout), so when the trainer has its batch no generation is in flight. The two wrappers slot into the
trainer loop's seams: `ColocatedSource` (the sample source: sleep once the batch is complete) and
`ColocatedControl` (the rollout control: wake around the weight transfer; what it shares with
time_sliced's control is `SleepingReplicaControl`). vLLM's CPU build accepts
sleep/wake and ignores them (it has no sleep mode); the turn-taking is the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


class SleepingReplicaControl:
    """What the rollout controls of a shared GPU have in common (colocated's and time_sliced's): the
    plain control they wrap, the rollout actor whose replicas sleep and wake, and the wake-ups timed."""

    def __init__(
        self,
        inner: Any,
        rollout_handle: Any,
        sleep_level: int,
        timeout_s: float,
        release_trainer_memory: Callable[[], None] | None = None,
        settle_trainer_memory: Callable[[], float] | None = None,
    ) -> None:
        """`inner`: the plain rollout control; `rollout_handle`: the rollout actor (sleep / wake_up /
        resume). `release_trainer_memory`: hands the trainer's cached GPU memory back before a wake-up
        (default `arl.trainer.memory.release_cached_gpu_memory`, imported here so that importing this
        module does not import torch). `settle_trainer_memory`: the trainer's memory still on its way
        out when the sync starts (the optimizer state's overlapped offload): called before the KV cache
        wakes, returns the seconds it waited; that memory is then released too."""
        if release_trainer_memory is None:
            from arl.trainer.memory import release_cached_gpu_memory

            release_trainer_memory = release_cached_gpu_memory
        self.inner = inner
        self.rollout = rollout_handle
        self.sleep_level = sleep_level
        self.timeout_s = timeout_s
        self.release_trainer_memory = release_trainer_memory
        self.settle_trainer_memory = settle_trainer_memory
        self._timings: dict[str, float] = {}

    def _add(self, key: str, seconds: float) -> None:
        self._timings[key] = self._timings.get(key, 0.0) + seconds

    async def _wake(self, tags: list[str] | None, key: str) -> None:
        """Wake the replicas' `tags` (None: everything), timed under `key`."""
        t0 = time.perf_counter()
        await asyncio.wait_for(self.rollout.wake_up.remote(tags), self.timeout_s)
        self._add(key, time.perf_counter() - t0)

    async def update_weights(
        self, sync_address: str | list[str], sync_config_json: bytes, version: int
    ) -> None:
        await self.inner.update_weights(sync_address, sync_config_json, version)

    def pop_timings(self) -> dict[str, float]:
        """The phases timed since the last call (seconds; the trainer's step metrics)."""
        out, self._timings = self._timings, {}
        return out


class ColocatedControl(SleepingReplicaControl):
    """`RolloutControl` that wakes the sleeping replicas around the weight transfer."""

    asleep = False  # the replicas sleep: from the step's batch to the weight sync

    async def sleep(self) -> None:
        """The step's samples are in: release the replicas' GPU memory for the trainer."""
        t0 = time.perf_counter()
        await asyncio.wait_for(self.rollout.sleep.remote(self.sleep_level), self.timeout_s)
        self.asleep = True
        self._add("colocated_sleep_s", time.perf_counter() - t0)

    async def pause(self) -> None:
        await self.inner.pause()
        if self.asleep:  # the weights' memory must be back before the sync writes into it
            self.release_trainer_memory()
            await self._wake(["weights"], "colocated_wake_weights_s")

    async def resume(self, queued_samples: int) -> None:
        if self.asleep:
            if self.settle_trainer_memory is not None:  # the KV cache takes the memory it frees
                self._add("colocated_offload_wait_s", self.settle_trainer_memory())
                self.release_trainer_memory()
            await self._wake(["kv_cache"], "colocated_wake_kv_s")
            self.asleep = False
        await self.inner.resume(queued_samples)


class ColocatedSource:
    """The trainer's sample source: once a step's `required` samples are taken, `on_batch_taken` runs
    (colocated: `ColocatedControl.sleep`, the replicas go to sleep; the simulator's time-sliced schedule:
    the rollouter's partial pause)."""

    def __init__(self, inner: Any, on_batch_taken: Callable[[], Awaitable[Any]], required: int) -> None:
        self.inner = inner
        self.on_batch_taken = on_batch_taken
        self.required = required
        self._taken = 0

    async def get_batch(self, n: int, timeout: float | None = None) -> list[Any]:
        batch = await self.inner.get_batch(n, timeout)
        self._taken += len(batch)
        if self._taken >= self.required:
            self._taken = 0
            await self.on_batch_taken()
        return batch

    async def size(self) -> int:
        return await self.inner.size()
