"""The rollouter with simulated engines: budget, the three sync behaviours, partial-rollout resume."""

import asyncio

import msgspec
import pytest
import torch

from arl.proxy.types import SamplingParams
from arl.queue import MessageQueue
from arl.rollout import Rollouter, ServerManager, Task, compute_budget, cycle_tasks
from arl.rollout.testing import SimEngine, TokenAgentLoop
from arl.sync import SyncConfig, WeightSender


def make_tasks(count: int) -> list[Task]:
    return [
        Task(id=f"t{i}", messages=[], agent="tokens", metadata={"prompt_ids": [i, i + 1]})
        for i in range(count)
    ]


def make_rollouter(engines, queue, *, staleness, trigger, partial, max_tokens=8, n=2):
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=4,
        staleness_threshold=staleness,
        trigger_parameter_sync_step=trigger,
        replicas=len(engines),
        per_replica=16,
    )
    return Rollouter(
        tasks=cycle_tasks(make_tasks(50), seed=0),
        manager=ServerManager(engines),
        sink=queue,
        agent_loops={"tokens": TokenAgentLoop()},
        sampling_params=SamplingParams(max_tokens=max_tokens),
        n=n,
        budget=budget,
        partial_rollout=partial,
    )


async def wait_for(predicate, timeout=10.0):
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def test_on_policy_mode_produces_exactly_one_step_then_waits():
    queue = MessageQueue(max_size=100)
    r = make_rollouter([SimEngine()], queue, staleness=0.0, trigger=1, partial=False)
    task = asyncio.create_task(r.run())
    await wait_for(lambda: queue.size() == 4)
    await asyncio.sleep(0.1)
    assert queue.size() == 4 and r.stats.started == 4  # the staleness budget is spent: nothing more starts
    samples = await queue.get_batch(4, timeout=1)
    assert all(len(s.responses) == 2 for s in samples)
    await r.pause()
    await r.resume(queued_samples=0)
    await wait_for(lambda: queue.size() == 4)
    assert r.stats.started == 8
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_resume_without_new_weights_keeps_the_staleness_budget():
    """A time-sliced GPU hands the engine back after a step without a sync: `resume(None)` restarts
    generation but does not re-arm the budget (no new weights), so nothing more starts than before."""
    queue = MessageQueue(max_size=100)
    r = make_rollouter([SimEngine()], queue, staleness=0.0, trigger=1, partial=True)
    task = asyncio.create_task(r.run())
    await wait_for(lambda: queue.size() == 4)
    await queue.get_batch(4, timeout=1)
    await r.pause()
    await r.resume(None)
    await asyncio.sleep(0.1)
    assert r.stats.started == 4 and queue.size() == 0  # budget still spent
    await r.pause()
    await r.resume(queued_samples=0)  # after a sync: re-armed
    await wait_for(lambda: queue.size() == 4)
    assert r.stats.started == 8
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_partial_rollout_aborts_and_resumes_with_new_version():
    engine = SimEngine(token_delay_s=0.01)
    queue = MessageQueue(max_size=100)
    r = make_rollouter([engine], queue, staleness=1.0, trigger=1, partial=True, max_tokens=30)
    task = asyncio.create_task(r.run())
    await wait_for(lambda: r.active > 0 and len(engine.calls) > 0)
    await asyncio.sleep(0.05)  # a few tokens in
    sync_config = SyncConfig(transport="cpu", timeout_s=20)
    sender = WeightSender(sync_config, num_receivers=1)
    try:
        await r.pause()
        assert r.manager.paused
        weights = {"w": torch.arange(10, dtype=torch.float32)}
        send = asyncio.to_thread(sender.send, weights.items(), 1)
        await asyncio.gather(send, r.update_weights(sender.address, msgspec.json.encode(sync_config), 1))
        assert torch.equal(engine.weights["w"], weights["w"])
        await r.resume(queued_samples=queue.size())
        samples = await queue.get_batch(4, timeout=10)
    finally:
        task.cancel()
        sender.close()
    assert r.manager.resumed_requests > 0
    mixed = [resp for s in samples for resp in s.responses if len(set(resp.weight_versions)) > 1]
    assert mixed, "a response generated across the sync carries both versions"
    for resp in mixed:
        assert len(resp.response_ids) == 30  # resumed to the full budget, no token lost
        assert resp.weight_versions == sorted(resp.weight_versions)  # old tokens first, then new
        # The resumed continuation follows on from the tokens already sampled.
        first_new = resp.weight_versions.index(1)
        assert resp.response_ids[first_new] == (resp.response_ids[first_new - 1] + 1) % 1000


async def test_without_partial_rollout_pause_waits_for_active_prompts():
    engine = SimEngine(token_delay_s=0.005)
    queue = MessageQueue(max_size=100)
    r = make_rollouter([engine], queue, staleness=1.0, trigger=1, partial=False, max_tokens=10)
    task = asyncio.create_task(r.run())
    await wait_for(lambda: r.active > 0)
    await r.pause()
    assert r.active == 0  # drained, nothing aborted
    produced = queue.size()
    assert r.manager.resumed_requests == 0
    await asyncio.sleep(0.1)
    assert queue.size() == produced  # paused: nothing new starts
    task.cancel()
    samples = await queue.get_batch(produced, timeout=1)
    assert all(len(resp.response_ids) == 10 for s in samples for resp in s.responses)


async def test_segments_travel_into_the_sample_and_are_counted():
    from arl.rollout.testing import SegmentedAgentLoop

    queue = MessageQueue(max_size=100)
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=2,
        staleness_threshold=0.0,
        trigger_parameter_sync_step=1,
        replicas=1,
        per_replica=8,
    )
    r = Rollouter(
        tasks=cycle_tasks(make_tasks(4), seed=0),
        manager=ServerManager([SimEngine()]),
        sink=queue,
        agent_loops={"tokens": SegmentedAgentLoop(turns=3)},
        sampling_params=SamplingParams(max_tokens=4),
        n=2,
        budget=budget,
        partial_rollout=False,
    )
    task = asyncio.create_task(r.run())
    samples = await queue.get_batch(2, timeout=10)
    task.cancel()
    for s in samples:
        for resp in s.responses:
            assert resp.num_segments == 3
            rows = s.segments_of(resp)
            assert rows[0].prompt_ids == s.prompt_ids
            trained = [t for row in rows for t, m in zip(row.response_ids, row.response_mask) if m]
            assert len(trained) == 3 * 4  # three turns of max_tokens each, every one trained once
    stats = r.stats.as_dict()
    assert stats["segments_per_trajectory"] == 3.0 and stats["trained_token_share"] == 1.0
    assert stats["generated_tokens"] == stats["sampled_tokens"] == 12 * stats["trajectories"]


async def test_dropped_prompts_give_their_budget_back():
    # The staleness budget allows 4 prompts before a sync; the first 4 stall past the generate timeout
    # and are dropped. The feed must start 4 more and fill the batch, or no sync ever comes.
    engine = SimEngine(stall_first_calls=8)  # n=2: the first 4 prompts' 8 calls
    queue = MessageQueue(max_size=100)
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=4,
        staleness_threshold=0.0,
        trigger_parameter_sync_step=1,
        replicas=1,
        per_replica=16,
    )
    r = Rollouter(
        tasks=cycle_tasks(make_tasks(50), seed=0),
        manager=ServerManager([engine], generate_timeout_s=0.2),
        sink=queue,
        agent_loops={"tokens": TokenAgentLoop()},
        sampling_params=SamplingParams(max_tokens=8),
        n=2,
        budget=budget,
        partial_rollout=False,
    )
    task = asyncio.create_task(r.run())
    try:
        samples = await queue.get_batch(4, timeout=10)
    finally:
        task.cancel()
    assert len(samples) == 4
    assert r.stats.dropped_timeout == 4 and r.stats.started == 8
