"""The agent-loop worker pool on a real local Ray: trajectories run in worker processes; a dead worker's
trajectories move to the others (counted) and the run goes on."""

from __future__ import annotations

import asyncio
import os

import pytest

for _key, _value in {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
}.items():
    os.environ.setdefault(_key, _value)

ray = pytest.importorskip("ray")

from arl.proxy.types import SamplingParams  # noqa: E402
from arl.queue import MessageQueue  # noqa: E402
from arl.rollout import Rollouter, ServerManager, Task, compute_budget, cycle_tasks  # noqa: E402
from arl.rollout.worker_pool import WorkerPool  # noqa: E402


class GeneratorActor:
    """The rollout side's load-balanced front (a ServerManager over a SimEngine) as an actor."""

    def __init__(self) -> None:
        from arl.rollout.testing import SimEngine

        self.manager = ServerManager([SimEngine(token_delay_s=0.002)])

    async def generate(self, request_id, prompt_ids, sampling_params):
        return await self.manager.generate(request_id, prompt_ids, sampling_params)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
async def test_rollouter_runs_groups_on_worker_processes_and_survives_a_dead_worker(ray_local):
    generator = ray.remote(num_cpus=0)(GeneratorActor).remote()
    # Workers register the loop themselves, from its import path.
    pool = WorkerPool.create(
        2, generator, {"tokens": {}}, factories={"tokens": "arl.rollout.testing:TokenAgentLoop"}
    )
    tasks = [
        Task(id=f"t{i}", messages=[], agent="tokens", metadata={"prompt_ids": [i, i + 1]}) for i in range(40)
    ]
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=4,
        staleness_threshold=1.0,
        trigger_parameter_sync_step=1,
        replicas=1,
        per_replica=8,
    )
    queue = MessageQueue(max_size=100)
    r = Rollouter(
        tasks=cycle_tasks(tasks, seed=0, epochs=1),
        manager=_LocalVersions(),
        sink=queue,
        agent_loops=pool.agent_loops(["tokens"]),
        sampling_params=SamplingParams(max_tokens=6),
        n=4,
        budget=budget,
        partial_rollout=False,
    )
    run = asyncio.create_task(r.run())
    try:
        first = await queue.get_batch(4, timeout=90)
        assert all(len(s.responses) == 4 and len(s.responses[0].response_ids) == 6 for s in first)
        stats = [await w.stats.remote() for w in pool._workers]
        assert len({s["pid"] for s in stats}) == 2 and all(s["pid"] != os.getpid() for s in stats)
        assert all(d > 0 for d in pool.dispatched)  # both workers got trajectories
        ray.kill(pool._workers[0])
        await r.pause()
        while queue.size():  # only groups started after the kill from here on
            await queue.get_batch(queue.size(), timeout=5)
        await r.resume(queued_samples=0)
        more = await queue.get_batch(4, timeout=30)
        assert len(more) == 4, (run.done() and run.exception(), r.stats.as_dict(), pool.stats())
        assert pool.stats()["workers_alive"] == 1
        assert pool.stats()["redispatched"] >= 1 and pool.lost_trajectories == 0  # moved, not lost
        assert all(len(s.responses) == 4 for s in more)
    finally:
        run.cancel()
        await pool.close()


class _LocalVersions:
    """The Rollouter's manager seam without engines here (generation happens behind the actor)."""

    weight_versions = [0]
    resumed_requests = 0

    def forget(self, request_id):
        pass

    async def pause(self, mode):
        pass

    async def resume(self):
        pass
