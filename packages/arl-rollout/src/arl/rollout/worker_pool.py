"""The agent-loop worker pool: agent loops (trials, their proxies, tokenization) in N worker processes.

Without it every trajectory's agent loop runs on the rollout actor's one event loop, next to the
engines' front-ends; with hundreds of Harbor trials (each a proxy, a tokenizer, sandbox I/O) that loop
is the bottleneck. Here:
- `AgentLoopWorker` is a Ray actor (an async actor: its own process and event loop) that owns its agent
  loops (built once per name from registered factories) and runs one trajectory per `run` call. Its
  loops reach the engines through a `RemoteGenerator`: the rollout side's `ServerManager` behind an actor
  method (the global, sticky-by-trajectory, least-in-flight load balancer stays in one place, so a
  trajectory's turns keep hitting one replica and partial rollout still resumes across syncs).
- `WorkerPool` holds the workers and gives the `Rollouter` ordinary `AgentLoop`s (`agent_loops()`) that
  send each trajectory to the worker with the fewest in flight. A worker that dies is left out from then
  on and its trajectories start again on the others (counted in `redispatched`); only when no worker is
  left does a trajectory fail, with `failure_kind="worker_lost"`.

apps/ only says how many workers and where (`WorkerPool.create(n, ..., options=)`: e.g. the nodes
that run sandboxes); the rest is here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.agent_loop import AgentLoop, make_agent_loop
from arl.rollout.errors import RolloutError
from arl.rollout.types import AgentResult, Task

log = logging.getLogger(__name__)


class RemoteGenerator:
    """A `Generator` over an actor handle whose `generate` method is a `ServerManager.generate`."""

    def __init__(self, handle: Any, timeout_s: float) -> None:
        self._handle = handle
        self._timeout_s = timeout_s

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        ref = self._handle.generate.remote(request_id, prompt_ids, sampling_params)
        return await asyncio.wait_for(ref, self._timeout_s)


class AgentLoopWorker:
    """One worker process: builds agent loops by name and runs trajectories on its own event loop.

    `loop_options` maps an agent-loop name to its factory's options (e.g. {"harbor": {"config": ...,
    "tokenizer": "/path/to/model"}}; a str tokenizer is loaded here, once); `imports` are modules to
    import first (they register loops, e.g. "arl.harbor.trial_loop"); `factories` registers more by
    import path ({"name": "pkg.mod:Factory"}).
    Wrap it with `ray.remote` (the pool does).
    """

    def __init__(
        self,
        generator_handle: Any,
        loop_options: Mapping[str, Mapping[str, Any]],
        *,
        imports: tuple[str, ...] = (),
        factories: Mapping[str, str] | None = None,
        generate_timeout_s: float = 600.0,
    ) -> None:
        import importlib

        from arl.rollout.agent_loop import register_agent_loop

        for module in imports:
            importlib.import_module(module)
        for name, path in (factories or {}).items():
            module, _, attr = path.partition(":")
            register_agent_loop(name, getattr(importlib.import_module(module), attr))
        self._generator = RemoteGenerator(generator_handle, generate_timeout_s)
        self._options = {name: dict(options) for name, options in loop_options.items()}
        self._loops: dict[str, AgentLoop] = {}
        self._tokenizers: dict[str, Any] = {}
        self.in_flight = 0
        self.completed = 0

    def _loop(self, name: str) -> AgentLoop:
        if name not in self._loops:
            if name not in self._options:
                raise RolloutError(f"worker has no agent loop {name!r}; configured: {sorted(self._options)}")
            options = dict(self._options[name])
            if isinstance(options.get("tokenizer"), str):  # a path: loaded once in this process
                options["tokenizer"] = self._tokenizer(options["tokenizer"])
            self._loops[name] = make_agent_loop(name, **options)
        return self._loops[name]

    def _tokenizer(self, path: str) -> Any:
        if path not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[path] = AutoTokenizer.from_pretrained(path)
        return self._tokenizers[path]

    async def run(
        self, name: str, task: Task, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult:
        self.in_flight += 1
        try:
            return await self._loop(name).run(task, self._generator, sampling_params, request_id)
        finally:
            self.in_flight -= 1
            self.completed += 1

    async def stats(self) -> dict[str, int]:
        return {"pid": os.getpid(), "in_flight": self.in_flight, "completed": self.completed}

    async def close(self) -> None:
        closing = [loop.close() for loop in self._loops.values() if hasattr(loop, "close")]
        await asyncio.gather(*closing, return_exceptions=True)


class _PooledLoop:
    """The `AgentLoop` the Rollouter sees: runs agent loop `name` on the pool's least busy worker."""

    def __init__(self, pool: WorkerPool, name: str) -> None:
        self._pool = pool
        self._name = name

    async def run(
        self, task: Task, generator: Any, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult:
        return await self._pool.run(self._name, task, sampling_params, request_id)


class WorkerPool:
    """N `AgentLoopWorker` actors behind least-in-flight dispatch (see the module docstring)."""

    def __init__(self, workers: list[Any]) -> None:
        if not workers:
            raise ValueError("a worker pool needs at least one worker")
        self._workers = list(workers)
        self._in_flight = [0] * len(workers)
        self._alive = [True] * len(workers)
        self.dispatched = [0] * len(workers)
        self.lost_trajectories = 0
        # Trajectories started again on another worker after theirs died (from scratch: a new trial).
        self.redispatched = 0

    @classmethod
    def create(
        cls,
        num_workers: int,
        generator_handle: Any,
        loop_options: Mapping[str, Mapping[str, Any]],
        *,
        imports: tuple[str, ...] = (),
        factories: Mapping[str, str] | None = None,
        generate_timeout_s: float = 600.0,
        num_cpus: float = 0,
        options: Sequence[Mapping[str, Any]] | None = None,
    ) -> WorkerPool:
        """Start `num_workers` worker actors whose loops generate through `generator_handle`;
        `options[i]` are more Ray actor options of worker i (e.g. the node it must run on)."""
        import ray

        if options is not None and len(options) != num_workers:
            raise ValueError(f"options for {len(options)} workers given, {num_workers} workers asked for")
        actor = ray.remote(num_cpus=num_cpus, max_concurrency=100_000)(AgentLoopWorker)
        workers = [
            actor.options(**dict(options[i] if options is not None else {})).remote(
                generator_handle,
                dict(loop_options),
                imports=imports,
                factories=dict(factories or {}),
                generate_timeout_s=generate_timeout_s,
            )
            for i in range(num_workers)
        ]
        return cls(workers)

    def agent_loops(self, names: list[str]) -> dict[str, AgentLoop]:
        """One pooled `AgentLoop` per name, for `Rollouter(agent_loops=...)`."""
        return {name: _PooledLoop(self, name) for name in names}

    def _pick(self) -> int:
        alive = [i for i, ok in enumerate(self._alive) if ok]
        if not alive:
            raise RolloutError("every agent-loop worker died")
        return min(alive, key=lambda i: self._in_flight[i])

    async def run(
        self, name: str, task: Task, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult:
        """Run one trajectory on the least busy live worker; if that worker dies, start it again on
        another (counted in `redispatched`); `worker_lost` only when no worker is left."""
        from ray.exceptions import RayActorError

        errors = []
        while any(self._alive):
            index = self._pick()
            self._in_flight[index] += 1
            self.dispatched[index] += 1
            try:
                return await self._workers[index].run.remote(name, task, sampling_params, request_id)
            except RayActorError as e:
                if self._alive[index]:
                    log.warning(
                        "agent-loop worker %d died (%s); its trajectories move to the others", index, e
                    )
                self._alive[index] = False
                self.redispatched += 1
                errors.append(f"worker {index}: {e}")
            finally:
                self._in_flight[index] -= 1
        self.lost_trajectories += 1
        return AgentResult(
            prompt_ids=[],
            response_ids=[],
            response_mask=[],
            response_logprobs=[],
            weight_versions=[],
            reward=0.0,
            failed=True,
            failure_kind="worker_lost",
            error="every agent-loop worker died: " + "; ".join(errors)[-2000:],
        )

    def stats(self) -> dict[str, Any]:
        return {
            "workers": len(self._workers),
            "workers_alive": sum(self._alive),
            "in_flight": list(self._in_flight),
            "dispatched": list(self.dispatched),
            "lost_trajectories": self.lost_trajectories,
            "redispatched": self.redispatched,
        }

    async def close(self, timeout_s: float = 30.0) -> None:
        import ray

        for worker, alive in zip(self._workers, self._alive, strict=True):
            if alive:
                try:
                    await asyncio.wait_for(worker.close.remote(), timeout_s)
                except Exception:  # noqa: BLE001 - teardown continues
                    pass
            ray.kill(worker)
