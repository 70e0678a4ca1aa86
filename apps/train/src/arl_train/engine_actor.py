"""One rollout replica per Ray actor, so each replica holds the devices Ray reserved for it.

`EngineActor` hosts one engine (vLLM or the in-tree torch engine) inside an actor placed by
`arl_train.placement` (its CUDA_VISIBLE_DEVICES are the replica's GPUs; vLLM starts its workers
there). `RemoteEngine` is the `arl.rollout` Engine the rollout actor's ServerManager drives: every
call goes to the replica's actor. A call that finds the actor dead raises `EngineDeadError`, which the
ServerManager answers by failing the replica's requests over to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.engine import PauseMode
from arl.rollout.errors import EngineDeadError, EngineError

#: Generate calls one replica serves at once (Ray's default for async actors is 1000).
MAX_CONCURRENCY = 100_000


class EngineActor:
    """A Ray actor holding one engine replica; the methods mirror the Engine protocol."""

    def __init__(self, kind: str, engine_config: Any) -> None:
        self.kind = kind
        if kind == "vllm":
            from arl.rollout.engines.vllm_engine import VllmEngine

            self.engine: Any = VllmEngine(engine_config)
        elif kind == "torch":
            from arl.rollout.engines.torch_engine import TorchEngine

            self.engine = TorchEngine(engine_config)
        else:
            raise ValueError(f"unknown engine kind {kind!r}")

    async def start(self) -> dict[str, Any]:
        import os

        await self.engine.start()
        return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "pid": os.getpid()}

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        try:
            return await self.engine.generate(request_id, prompt_ids, sampling_params)
        except Exception as e:
            # vLLM's engine core died under a live actor: the replica is as dead as a killed actor.
            if type(e).__name__ == "EngineDeadError" and not isinstance(e, EngineDeadError):
                raise EngineDeadError(f"the {self.kind} engine died: {e}") from e
            raise

    async def pause(self, mode: PauseMode) -> None:
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()

    async def abort_all(self) -> None:
        await self.engine.abort_all()

    async def load_weights(
        self, sync_address: str, sync_config_json: bytes, version: int
    ) -> dict[str, float]:
        await self.engine.load_weights(sync_address, sync_config_json, version)
        return dict(getattr(self.engine, "last_sync", {}))

    async def sleep(self, level: int) -> bool:
        """Release the replica's GPU memory (False: this engine has no sleep)."""
        if not hasattr(self.engine, "sleep"):
            return False
        await self.engine.sleep(level)
        return True

    async def wake_up(self, tags: list[str] | None) -> None:
        if hasattr(self.engine, "wake_up"):
            await self.engine.wake_up(tags)

    async def worker_weights(self) -> list[bytes]:
        """Every worker's parameters (TP rank order) as safetensors bytes, engine naming."""
        from safetensors.torch import save

        if hasattr(self.engine, "worker_weights_per_rank"):
            ranks = await self.engine.worker_weights_per_rank()
        else:
            ranks = [await self.engine.worker_weights()]
        return [save({k: v.contiguous() for k, v in r.items()}) for r in ranks]

    async def weight_digests(self) -> list[dict[str, Any]]:
        """Every worker's parameter fingerprints (TP rank order, engine naming; `weights_digest`)."""
        return await self.engine.worker_digests_per_rank()

    async def weight_version(self) -> int:
        return self.engine.weight_version

    async def scheduler_stats(self) -> dict[str, float]:
        """The engine's scheduler counters (`VllmEngine.pop_scheduler_stats`; {} for an engine that keeps
        none)."""
        pop = getattr(self.engine, "pop_scheduler_stats", None)
        return pop() if pop is not None else {}

    async def in_flight(self) -> int:
        """Requests the engine is generating now (-1: this engine does not say)."""
        return getattr(self.engine, "in_flight", -1)

    async def stop(self) -> None:
        await self.engine.stop()


@contextlib.contextmanager
def _actor_death_as_engine_death(what: str) -> Iterator[None]:
    """Ray's "the actor died" errors become `EngineDeadError` (arl-rollout does not know Ray)."""
    from ray.exceptions import RayActorError

    try:
        yield
    except RayActorError as e:
        raise EngineDeadError(f"engine replica died during {what}: {type(e).__name__}") from e


class RemoteEngine:
    """The Engine protocol over an `EngineActor` handle (used inside the rollout actor)."""

    def __init__(
        self, handle: Any, initial_version: int, rpc_timeout_s: float, start_timeout_s: float
    ) -> None:
        self.handle = handle
        self._version = initial_version
        self._rpc_timeout_s = rpc_timeout_s
        self._start_timeout_s = start_timeout_s
        #: Phase timings (seconds) of this replica's last weight load.
        self.last_sync: dict[str, float] = {}
        #: What the replica's actor reported at start (its CUDA_VISIBLE_DEVICES, pid).
        self.info: dict[str, Any] = {}

    @property
    def weight_version(self) -> int:
        return self._version

    async def _call(self, ref: Any, what: str, timeout_s: float | None = None) -> Any:
        timeout_s = self._rpc_timeout_s if timeout_s is None else timeout_s
        try:
            with _actor_death_as_engine_death(what):
                return await asyncio.wait_for(ref, timeout_s)
        except TimeoutError:
            raise EngineError(f"engine replica: {what} took longer than {timeout_s:g}s") from None

    async def start(self) -> None:
        self.info = await self._call(self.handle.start.remote(), "start", self._start_timeout_s)

    async def stop(self) -> None:
        await self._call(self.handle.stop.remote(), "stop", 60.0)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        # No timeout here: the server manager bounds every generate call (rollout.generate_timeout_s).
        ref = self.handle.generate.remote(request_id, prompt_ids, sampling_params)
        try:
            with _actor_death_as_engine_death("generate"):
                return await ref
        except asyncio.CancelledError:
            # Cancelling the await leaves the actor's call running: cancel it there too, so the engine
            # aborts the request instead of generating for nobody (a timed-out or cancelled trajectory).
            import ray

            ray.cancel(ref)
            raise

    async def abort_all(self) -> None:
        await self._call(self.handle.abort_all.remote(), "abort_all")

    async def pause(self, mode: PauseMode) -> None:
        await self._call(self.handle.pause.remote(mode), f"pause({mode})")

    async def resume(self) -> None:
        await self._call(self.handle.resume.remote(), "resume")

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        self.last_sync = await self._call(
            self.handle.load_weights.remote(sync_address, sync_config_json, version), "load_weights"
        )
        self._version = version

    async def sleep(self, level: int) -> bool:
        return await self._call(self.handle.sleep.remote(level), "sleep")

    async def scheduler_stats(self) -> dict[str, float]:
        return await self._call(self.handle.scheduler_stats.remote(), "scheduler_stats")

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._call(self.handle.wake_up.remote(tags), "wake_up")

    async def worker_weights(self) -> list[bytes]:
        return await self._call(self.handle.worker_weights.remote(), "worker_weights")

    async def weight_digests(self) -> list[dict[str, Any]]:
        return await self._call(self.handle.weight_digests.remote(), "weight_digests")
