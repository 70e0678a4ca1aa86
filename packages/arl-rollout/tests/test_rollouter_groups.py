"""Groups whose members fail or render their own prompt train on the rest; every drop is counted by kind."""

import asyncio

from arl.proxy.types import SamplingParams
from arl.queue import MessageQueue
from arl.rollout import Rollouter, ServerManager, Task, compute_budget, cycle_tasks
from arl.rollout.testing import MixedGroupAgentLoop, SimEngine


async def test_group_with_failed_and_overflowing_members_trains_on_the_rest():
    tasks = [
        Task(id=f"t{i}", messages=[], agent="mixed", metadata={"prompt_ids": [i, i + 1]}) for i in range(3)
    ]
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=2,
        staleness_threshold=0.0,
        trigger_parameter_sync_step=1,
        replicas=1,
        per_replica=8,
    )
    queue = MessageQueue(max_size=10)
    r = Rollouter(
        tasks=cycle_tasks(tasks, seed=0, epochs=1),
        manager=ServerManager([SimEngine()]),
        sink=queue,
        agent_loops={"mixed": MixedGroupAgentLoop()},
        sampling_params=SamplingParams(max_tokens=4),
        n=4,
        budget=budget,
        partial_rollout=False,
    )
    run = asyncio.create_task(r.run())
    samples = await queue.get_batch(2, timeout=10)
    run.cancel()
    for s in samples:
        assert len(s.responses) == 3  # the failed member is left out, the run goes on
        own = [resp.prompt_ids for resp in s.responses]
        assert own[1:] == [None, None] and own[0] == [*s.prompt_ids, 99, 98]
        assert s.prompt_of(s.responses[0]) == own[0] and s.prompt_of(s.responses[2]) == s.prompt_ids
        assert s.responses[0].finish_reason == "length"
    stats = r.stats.as_dict()
    assert stats["failed_by_kind"] == {"sandbox": 2} and stats["kept_by_kind"] == {"context_length": 2}
    assert stats["own_prompt_responses"] == 2 and stats["failed_trajectories"] == 2
    assert stats["trained_responses"] == 6 and stats["turns"] == 6
    assert stats["phase_mean_s"] == {"environment_setup": 0.5, "agent_execution": 1.0}
