"""Asynchronous training on shared GPUs (`resources.shared_gpu`): rollout and training on the same GPUs
without waiting for a batch's tail.

Both schedules use the colocated placement (one trainer rank and one replica per GPU, each rank sending
the weights to the replica beside it by CUDA IPC) and keep the run's async mode (b, c, d): per-token
weight versions, the staleness budget, `max_version_lag` and lossless resume work as in the split modes.

* **time_sliced**: the replica generates while the trainer waits for its batch; the staleness budget
  keeps it fed with more prompts than one batch, so its batch stays refilled. Once the trainer holds its
  batch, `TimeSlicedSource` has the control *yield* the GPU: the in-flight generations are aborted with
  their partial tokens (the rollouter's partial-rollout pause), the replica sleeps (vLLM releases its
  KV cache and weights), the trainer trains; then the sync wakes the weights, the transfer writes into
  them, the KV cache wakes and the aborted generations resume (`ServerManager` resubmits them with the
  tokens so far, each token keeping the version that sampled it). A step that does not sync
  (trigger_parameter_sync_step > 1) hands the GPU back after the step (`end_step`): the replica wakes
  and goes on with its current weights, the staleness budget untouched (no new weights).
* **concurrent**: nothing to schedule here: the replica stays resident and keeps generating while the
  trainer trains, the memory split by `rollout.gpu_memory_utilization` and
  `resources.trainer_memory_fraction` (`limit_trainer_memory`); the sync pauses it for the transfer only
  (the plain rollout control, as in the split modes). A trainer step that runs out of memory beside the
  replica fails with `SharedGpuOutOfMemory`, which names the keys of the split (`explain_out_of_memory`).

vLLM's CPU build accepts sleep/wake and ignores them, so on the CPU the turn-taking is exercised
(aborts, resumes, the order of the calls) but no memory moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from arl_train.colocated import SleepingReplicaControl


class TimeSlicedControl(SleepingReplicaControl):
    """`RolloutControl` of a time-sliced GPU: yields it to the trainer once the batch is ready, wakes
    the replica around the weight transfer, hands the GPU back after a step without a sync. Its
    `inner` control's pause aborts the in-flight generations (time_sliced runs resume partials)."""

    yielded = False  # generation paused and the replica asleep: the trainer has the GPU
    weights_awake = True
    yields = 0  # GPU yields so far (metric shared_yields_total)

    async def yield_gpu(self) -> None:
        """The trainer's batch is in: abort the in-flight generations (kept, resumed later) and put the
        replica to sleep."""
        if self.yielded:
            return
        t0 = time.perf_counter()
        await self.inner.pause()
        t1 = time.perf_counter()
        await asyncio.wait_for(self.rollout.sleep.remote(self.sleep_level), self.timeout_s)
        self._add("shared_pause_s", t1 - t0)
        self._add("shared_sleep_s", time.perf_counter() - t1)
        self.yielded = True
        self.weights_awake = False
        self.yields += 1

    async def _wake_kv_cache(self) -> None:
        if self.settle_trainer_memory is not None:  # the KV cache takes the memory the state frees
            self._add("shared_offload_wait_s", self.settle_trainer_memory())
        self.release_trainer_memory()
        await self._wake(["kv_cache"] if self.weights_awake else None, "shared_wake_kv_s")  # None: all
        self.weights_awake = True

    # ----- RolloutControl: the trainer's sync ------------------------------------------------------
    async def pause(self) -> None:
        if not self.yielded:  # a sync outside a step (the final sync): an ordinary pause
            await self.inner.pause()
            return
        self.release_trainer_memory()  # the weights' memory must be back before the sync writes into it
        await self._wake(["weights"], "shared_wake_weights_s")
        self.weights_awake = True

    async def resume(self, queued_samples: int) -> None:
        if self.yielded:
            await self._wake_kv_cache()
            self.yielded = False
        await self.inner.resume(queued_samples)

    # ----- after a step ------------------------------------------------------------------------------
    async def end_step(self) -> None:
        """Hand the GPU back if the step did not sync: the replica wakes whole and resumes its aborted
        generations with the weights it has; the staleness budget is not re-armed (no new weights)."""
        if not self.yielded:
            return
        self.weights_awake = False
        await self._wake_kv_cache()  # weights and KV cache in one wake
        self.yielded = False
        t0 = time.perf_counter()
        await asyncio.wait_for(self.rollout.resume.remote(None), self.timeout_s)
        self._add("shared_resume_s", time.perf_counter() - t0)

    def pop_timings(self) -> dict[str, float]:
        return super().pop_timings() | {"shared_yields_total": float(self.yields)}


class TimeSlicedSource:
    """The trainer's sample source on a time-sliced GPU: once a step's `required` samples are taken,
    the control yields the GPU to the trainer. If the trainer asks for more after that (samples dropped
    by `max_version_lag` or dynamic sampling), the replica gets the GPU back until they come."""

    def __init__(self, inner: Any, control: TimeSlicedControl, required: int) -> None:
        self.inner = inner
        self.control = control
        self.required = required
        self._taken = 0

    async def get_batch(self, n: int, timeout: float | None = None) -> list[Any]:
        if self.control.yielded:  # more samples needed after the yield: generation must go on
            await self.control.end_step()
        batch = await self.inner.get_batch(n, timeout)
        self._taken += len(batch)
        if self._taken >= self.required:
            await self.control.yield_gpu()
        return batch

    async def end_step(self) -> None:
        """The trainer's step is over: count the next one's samples from zero, and hand the GPU back
        if the step did not (no sync)."""
        self._taken = 0
        await self.control.end_step()

    async def size(self) -> int:
        return await self.inner.size()


def limit_trainer_memory(fraction: float) -> None:
    """Concurrent on a GPU: cap this trainer process at `fraction` of its GPU's memory (PyTorch's
    per-process fraction), so it stops with its own out-of-memory error rather than take the memory the
    resident replica was promised. 0: no cap; a no-op without CUDA."""
    import torch

    if fraction > 0 and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(fraction)


class SharedGpuOutOfMemory(RuntimeError):
    """The trainer ran out of GPU memory beside the resident replica of `resources.shared_gpu='concurrent'`:
    the memory split does not fit this model on this GPU. The message names the keys that change it."""


def concurrent_oom_advice(config: Any) -> str:
    """What to change when the trainer runs out of memory beside a resident replica, with this run's values."""
    actor, r = config.actor, config.resources
    cap = (
        f", resources.trainer_memory_fraction={r.trainer_memory_fraction}"
        if r.trainer_memory_fraction
        else ""
    )
    return (
        f"the trainer ran out of GPU memory beside the resident replica (resources.shared_gpu='concurrent', "
        f"rollout.gpu_memory_utilization={config.rollout.gpu_memory_utilization} of the GPU for the replica{cap}). "
        f"Give the replica less (lower rollout.gpu_memory_utilization), or the trainer's step less: lower "
        f"actor.max_tokens_per_microbatch (is {actor.max_tokens_per_microbatch}), set "
        f"actor.activation_checkpointing (is {actor.activation_checkpointing!r}), actor.activation_offload=true "
        f"or actor.optimizer_offload=true; or use resources.shared_gpu='time_sliced', whose replica frees its "
        f"memory while the trainer trains."
    )


def concurrent_oom_message(advice: str, cause: BaseException) -> str:
    """`advice` (`concurrent_oom_advice`) and the first line of torch's own message."""
    first = next((line for line in str(cause).splitlines() if line.strip()), type(cause).__name__)
    return f"{advice} torch: {first}"


@contextlib.contextmanager
def explain_out_of_memory(advice: str) -> Iterator[None]:
    """Around a trainer step of `resources.shared_gpu='concurrent'` on a GPU: a CUDA out-of-memory error
    becomes `SharedGpuOutOfMemory`, which says which keys split the GPU (`advice`: torch's own message
    names none)."""
    import torch

    try:
        yield
    except torch.OutOfMemoryError as exc:
        raise SharedGpuOutOfMemory(concurrent_oom_message(advice, exc)) from exc
