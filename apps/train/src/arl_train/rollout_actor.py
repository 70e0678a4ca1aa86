"""The rollout side's Ray actor: the Rollouter over the replicas' engine actors, feeding the queue.

Built from its spec (`arl_train.actor_specs.RolloutSpec`), it starts a `RemoteEngine` per replica
actor, the agent loops (in this process, or in worker processes: `arl.rollout.worker_pool`), and the
feed loop, whose samples reach the arl-queue actor through the ledger's recording sink. The trainer
drives weight syncs through its pause / update_weights / resume. This module imports no torch (the
actor samples nothing itself: the replicas do), so the actor's process stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from arl.rollout.engines.vllm_scheduler_stats import ReplicaWindows
from arl_train import ledger
from arl_train.actor_specs import RolloutSpec
from arl_train.engine_actor import RemoteEngine
from arl_train.harbor_section import load_tasks

__all__ = ["RPC_TIMEOUT_S", "RolloutActor"]

# The bound of a call between a run's actors (a weight load or a draining pause can take minutes).
RPC_TIMEOUT_S = 600.0
SCHEDULER_STATS_TIMEOUT_S = 10.0


class RolloutActor:
    def __init__(
        self,
        spec: RolloutSpec,
        tokenizer: Any,
        queue_handle: Any,
        engine_handles: list[Any],
        worker_options: list[dict[str, Any]] | None = None,
    ) -> None:
        self.spec = spec
        # The model's tokenizer as the driver loaded it (`AutoTokenizer`), handed on to the agent-loop
        # workers: unpickling it imports only its own class, where loading it here by path would import
        # transformers' auto classes and torch with them (~4 CPU-s in each process).
        self.tokenizer = tokenizer
        self.queue_handle = queue_handle
        self.engine_handles = engine_handles
        # Ray options of each agent-loop worker (the node it runs on: arl_train.cluster); None: Ray's choice.
        self.worker_options = worker_options or None
        self.rollouter: Any = None
        self._run_task: asyncio.Task[None] | None = None
        self._engines: list[Any] = []
        self._scheduler_windows = ReplicaWindows()  # the replicas' vLLM schedulers, one window per step
        self._agent_loops: dict[str, Any] = {}
        self._pool: Any = None

    async def start(
        self, initial_version: int = 0, skip_tasks: int = 0, replay_tasks: list[int] = ()
    ) -> None:
        """Start the engines (holding weights of `initial_version`), then the feed loop in the
        background of this actor; `skip_tasks` resumes the dataset where a checkpoint left it."""
        from arl.queue.ray_actor import QueueClient
        from arl.rollout import Rollouter, ServerManager, make_agent_loop

        spec, tokenizer = self.spec, self.tokenizer
        tasks = load_tasks(spec.tasks)  # fail fast on bad data
        self._engines = [
            RemoteEngine(h, initial_version, rpc_timeout_s=RPC_TIMEOUT_S, start_timeout_s=RPC_TIMEOUT_S)
            for h in self.engine_handles
        ]
        await asyncio.gather(*(e.start() for e in self._engines))
        manager = ServerManager(self._engines, generate_timeout_s=spec.generate_timeout_s)
        agent_names = sorted({t.agent for t in tasks})
        options: dict[str, dict[str, Any]] = {name: {} for name in agent_names}
        if "harbor" in agent_names:
            from arl.harbor.trial_loop import check_harbor_config  # registers the "harbor" agent loop

            options["harbor"] = {"config": spec.harbor}
            check_harbor_config(spec.harbor)  # a bad agent/environment fails here, by name
        if spec.agent_workers > 0:  # agent loops in worker processes, generating through self.generate
            import ray

            from arl.rollout.worker_pool import WorkerPool

            self._pool = WorkerPool.create(
                spec.agent_workers,
                ray.get_runtime_context().current_actor,
                {name: {"tokenizer": tokenizer, **options[name]} for name in agent_names},
                imports=("arl.harbor.trial_loop",) if "harbor" in agent_names else (),
                generate_timeout_s=spec.generate_timeout_s,
                options=self.worker_options,
            )
            self._agent_loops = self._pool.agent_loops(agent_names)
        else:
            self._agent_loops = {
                name: make_agent_loop(name, tokenizer=tokenizer, **options[name]) for name in agent_names
            }
        # Dataset positions in flight are checkpointed and replayed first on resume (see ledger.TaskTracker).
        self._tracker = ledger.TaskTracker(tasks, seed=spec.seed, skip=skip_tasks, replay=list(replay_tasks))
        self.rollouter = Rollouter(
            tasks=iter(self._tracker),
            manager=manager,
            sink=ledger.RecordingSink(_BlockingSink(QueueClient(self.queue_handle)), self._tracker),
            agent_loops=self._agent_loops,
            sampling_params=spec.sampling,
            n=spec.n,
            budget=spec.budget,
            partial_rollout=spec.partial_rollout,
            drain_timeout_s=spec.drain_timeout_s,
        )
        self._run_task = asyncio.create_task(self.rollouter.run())

    def _check_alive(self) -> None:
        if self._run_task is not None and self._run_task.done():
            self._run_task.result()  # re-raise the feed loop's failure in the caller

    async def pause(self) -> int:
        """Pause generation; returns how many sync receivers the live replicas hold (dead ones skip syncs)."""
        self._check_alive()
        await self.rollouter.pause()
        live = self.rollouter.manager.healthy_replicas
        if not live:  # every replica died (e.g. during this pause): nothing can receive the weights
            from arl.rollout.errors import NoHealthyReplicaError

            raise NoHealthyReplicaError(
                f"all {len(self._engines)} engine replicas are dead; no weight sync possible"
            )
        return self.spec.receivers_per_replica * len(live)

    async def update_weights(
        self, sync_address: str | list[str], sync_config_json: bytes, version: int
    ) -> None:
        await self.rollouter.update_weights(sync_address, sync_config_json, version)

    async def resume(self, queued_samples: int | None) -> None:
        """Resume generation; `queued_samples` re-arms the staleness budget after a sync (None: after a
        time-sliced yield without new weights, the budget stays)."""
        await self.rollouter.resume(queued_samples)

    async def sleep(self, level: int) -> float:
        """Colocated mode: every replica releases its GPU memory (generation must be idle); seconds.
        A replica found dead is left out from then on, as in a sync (the next sync says if that is fatal)."""
        t0 = time.perf_counter()
        await self.rollouter.manager.each_healthy(lambda _, e: e.sleep(level))
        return time.perf_counter() - t0

    async def wake_up(self, tags: list[str] | None) -> float:
        t0 = time.perf_counter()
        await self.rollouter.manager.each_healthy(lambda _, e: e.wake_up(tags))
        return time.perf_counter() - t0

    async def pop_scheduler_stats(self) -> dict[str, float]:
        """The healthy replicas' scheduler counters since the last call, as one window (`ReplicaWindows`;
        {} for engines that keep none). The step loop calls it once per step. A diagnostic must not
        stall the run: a replica that does not answer within SCHEDULER_STATS_TIMEOUT_S (stopped, or its
        actor busy) is left out of this step's window (its preemptions are counted at its next read)."""
        reads: dict[int, dict[str, float]] = {}

        async def scheduler(replica: int, engine: Any) -> None:
            with contextlib.suppress(TimeoutError):
                read = await asyncio.wait_for(engine.scheduler_stats(), SCHEDULER_STATS_TIMEOUT_S)
                if read:
                    reads[replica] = read

        await self.rollouter.manager.each_healthy(scheduler)
        return self._scheduler_windows.merge(reads)

    async def stats(self) -> dict[str, Any]:
        self._check_alive()
        phases: dict[str, float] = {}
        for e in self._engines:  # the slowest replica sets each phase ("inplace": the least in place)
            for k, v in e.last_sync.items():
                phases[k] = (min if k == "inplace" else max)(phases.get(k, v), v)
        return (
            self.rollouter.stats.as_dict()
            | {
                "active": self.rollouter.active,
                "resumed_requests": self.rollouter.manager.resumed_requests,
                "failovers": self.rollouter.manager.failovers,
                "sync_sources": self.rollouter.manager.sync_sources,
                "replicas_healthy": self.rollouter.manager.healthy_replicas,
                "engine_versions": self.rollouter.manager.weight_versions,
                "last_sync": phases,
            }
            | ({"agent_workers": self._pool.stats()} if self._pool is not None else {})
        )

    async def dataset_position(self) -> dict[str, Any]:
        """Where the feed stands, for a checkpoint (`ledger.TaskTracker.position`)."""
        self._check_alive()
        return self._tracker.position()

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: Any) -> Any:
        """The load-balanced engines, for agent-loop workers (`run.agent_workers` > 0)."""
        return await self.rollouter.manager.generate(request_id, prompt_ids, sampling_params)

    async def replica_info(self) -> list[dict[str, Any]]:
        """What each replica's actor reported at start (its CUDA_VISIBLE_DEVICES, pid)."""
        return [e.info for e in self._engines]

    async def engine_digests(self, replica: int = 0) -> list[dict[str, Any]]:
        """Replica `replica`'s parameter fingerprints, one dict per TP rank (engine naming)."""
        return await self._engines[replica].weight_digests()

    async def probe(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float], int]:
        """Sample from replica 0 directly: tokens, their log probs, and the engine's weight version."""
        from arl.proxy.types import SamplingParams

        engine = self._engines[self.rollouter.manager.healthy_replicas[0]]
        out = await engine.generate(
            "arl-probe", prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=1.0)
        )
        return out.token_ids, out.log_probs, engine.weight_version

    async def stop(self) -> None:
        if self._run_task is not None:
            self._run_task.cancel()
            try:
                await self._run_task
            except (asyncio.CancelledError, Exception):
                pass
        closing = [loop.close() for loop in self._agent_loops.values() if hasattr(loop, "close")]
        if self._pool is not None:
            closing.append(self._pool.close())
        await asyncio.gather(*closing, *(e.stop() for e in self._engines), return_exceptions=True)


class _BlockingSink:
    """Puts a sample, waiting while the queue is full (back-pressure, never a drop)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def put(self, sample: Any) -> None:
        while not await self.client.put(sample, timeout=30.0):
            pass
