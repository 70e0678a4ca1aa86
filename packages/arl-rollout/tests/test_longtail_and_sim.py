"""The long-tail workload (lengths, per-task sampling overrides, synthetic reward), the server
manager's utilization counters, and the simulation parts (virtual clock, cost-model engine)."""

import asyncio
import statistics

import pytest

from arl.proxy.types import SamplingParams
from arl.queue import MessageQueue
from arl.rollout import Rollouter, ServerManager, Task, compute_budget, cycle_tasks, get_reward, load_tasks
from arl.rollout.errors import DatasetError, RolloutError
from arl.rollout.longtail import parse_spec, sample_lengths
from arl.rollout.rollouter import task_sampling_params
from arl.rollout.testing import CostModelEngine, DecodeCost, SimEngine, TokenAgentLoop, VirtualClockLoop


def test_lengths_are_lognormal_with_the_asked_median_and_tail():
    spec = parse_spec("median=100&p99_ratio=8&max=100000")
    lengths = sorted(sample_lengths(spec, 20000, seed=1))
    median, p99 = lengths[len(lengths) // 2], lengths[int(0.99 * len(lengths))]
    assert 90 <= median <= 110
    assert 6.5 <= p99 / median <= 9.5
    assert sample_lengths(spec, 50, seed=1) == sample_lengths(spec, 50, seed=1)
    assert max(sample_lengths(parse_spec("median=100&max=150"), 2000, seed=0)) == 150


def test_longtail_tasks_carry_their_length_and_are_labelled_synthetic():
    tasks = load_tasks("builtin:longtail?median=20&p99_ratio=4&max=64", seed=0, size=30)
    assert len(tasks) == 30 and all(
        t.reward_fn == "synthetic_hash" and t.metadata["synthetic"] for t in tasks
    )
    for t in tasks:
        assert t.metadata["sampling"] == {"max_tokens": t.metadata["target_tokens"], "ignore_eos": True}
        assert 1 <= t.metadata["target_tokens"] <= 64
    assert load_tasks("builtin:longtail", seed=0, size=3)[0].metadata["target_tokens"] >= 1  # defaults


def test_longtail_with_the_digits_reward_is_learnable_and_not_labelled_synthetic():
    tasks = load_tasks("builtin:longtail?median=20&max=64&reward=digits", seed=0, size=5)
    assert all(t.reward_fn == "digits" and "synthetic" not in t.metadata for t in tasks)
    reward = get_reward("digits")
    assert reward("12 4", None) == 0.75 and reward("abcd", None) == 0.0  # the share of digit characters
    # Same lengths and prompts as the default reward: only the reward changes.
    hashed = load_tasks("builtin:longtail?median=20&max=64", seed=0, size=5)
    assert [t.messages for t in tasks] == [t.messages for t in hashed]
    assert [t.metadata["sampling"] for t in tasks] == [t.metadata["sampling"] for t in hashed]


def test_bad_longtail_parameters_are_named():
    with pytest.raises(DatasetError, match="mediam"):
        load_tasks("builtin:longtail?mediam=3", seed=0, size=2)
    with pytest.raises(DatasetError, match="median='abc'"):
        load_tasks("builtin:longtail?median=abc", seed=0, size=2)
    with pytest.raises(DatasetError, match="p99_ratio"):
        load_tasks("builtin:longtail?p99_ratio=0.5", seed=0, size=2)
    with pytest.raises(DatasetError, match="reward"):
        load_tasks("builtin:longtail?reward=exact", seed=0, size=2)
    with pytest.raises(DatasetError, match="longtail"):
        load_tasks("builtin:nope", seed=0, size=2)


def test_synthetic_reward_is_deterministic_and_spread():
    reward = get_reward("synthetic_hash")
    scores = [reward(f"text {i}", None) for i in range(200)]
    assert scores == [reward(f"text {i}", None) for i in range(200)]
    assert all(0.0 <= s <= 1.0 for s in scores) and 0.3 < statistics.mean(scores) < 0.7


def test_task_sampling_override_and_its_errors():
    base = SamplingParams(max_tokens=8, temperature=0.7)
    task = Task(id="x", messages=[], metadata={"sampling": {"max_tokens": 99, "ignore_eos": True}})
    p = task_sampling_params(base, task)
    assert (p.max_tokens, p.ignore_eos, p.temperature) == (99, True, 0.7)
    assert task_sampling_params(base, Task(id="y", messages=[])) is base
    with pytest.raises(RolloutError, match="unknown keys \\['max_tokenz'\\]"):
        task_sampling_params(base, Task(id="z", messages=[], metadata={"sampling": {"max_tokenz": 1}}))
    with pytest.raises(RolloutError, match="task w"):
        task_sampling_params(base, Task(id="w", messages=[], metadata={"sampling": {"max_tokens": "many"}}))


async def test_rollouter_generates_each_task_s_exact_length_and_counts_utilization():
    tasks = load_tasks("builtin:longtail?median=6&p99_ratio=4&max=40", seed=0, size=12)
    for i, t in enumerate(tasks):
        t.agent = "tokens"
        t.metadata["prompt_ids"] = [i, i + 1]
    engine = SimEngine(token_delay_s=0.001)
    manager = ServerManager([engine])
    queue = MessageQueue(max_size=100)
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=12,
        staleness_threshold=0.0,
        trigger_parameter_sync_step=1,
        replicas=1,
        per_replica=16,
    )
    r = Rollouter(
        tasks=cycle_tasks(tasks, seed=0, epochs=1),
        manager=manager,
        sink=queue,
        agent_loops={"tokens": TokenAgentLoop()},
        sampling_params=SamplingParams(max_tokens=3),
        n=2,
        budget=budget,
        partial_rollout=False,
    )
    await asyncio.wait_for(r.run(), 30)
    samples = await queue.get_batch(12, timeout=1)
    by_id = {t.id: t.metadata["target_tokens"] for t in tasks}
    assert len(samples) == 12
    for s in samples:
        assert all(len(resp.response_ids) == by_id[s.task_id] for resp in s.responses)
        assert s.metadata["synthetic"] is True
    stats = r.stats.as_dict()
    total = sum(by_id.values()) * 2
    assert stats["engine_generated_tokens"] == total
    assert 0.0 < stats["engine_busy_s"] <= stats["manager_elapsed_s"] + 1e-6
    assert 0.0 <= stats["engine_idle_fraction"] < 1.0


def test_virtual_clock_runs_hours_instantly_and_reports_deadlock():
    loop = VirtualClockLoop()
    try:

        async def long_sleep():
            await asyncio.sleep(3600)
            return asyncio.get_running_loop().time()

        assert loop.run_until_complete(long_sleep()) == pytest.approx(3600)

        async def deadlock():
            await asyncio.Event().wait()

        with pytest.raises(RuntimeError, match="blocked"):
            loop.run_until_complete(deadlock())
    finally:
        loop.close()


def test_cost_model_engine_takes_the_calibrated_time():
    cost = DecodeCost(batch_sizes=[1, 4], tokens_per_s=[10.0, 20.0])  # per sequence: 10/s alone, 5/s at 4

    async def scenario():
        loop = asyncio.get_running_loop()
        engine = CostModelEngine(cost)
        await engine.start()
        t0 = loop.time()
        # 4 sequences of 10 tokens, then 1 of 20: 10 tokens at 5/s (2 s); the last 10 alone at 10/s (1 s)
        params = [SamplingParams(max_tokens=10)] * 3 + [SamplingParams(max_tokens=20)]
        outs = await asyncio.gather(*(engine.generate(f"r{i}", [1], p) for i, p in enumerate(params)))
        elapsed = loop.time() - t0
        await engine.stop()
        return outs, elapsed

    loop = VirtualClockLoop()
    try:
        outs, elapsed = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert [len(o.token_ids) for o in outs] == [10, 10, 10, 20]
    assert all(o.stop_reason == "length" for o in outs)
    assert elapsed == pytest.approx(3.0, rel=1e-6)
    assert cost.rate(2) == pytest.approx(10 + 10 / 3)  # piecewise linear between the calibration points


def test_cost_model_engine_abort_keeps_partial_tokens_and_versions():
    cost = DecodeCost(batch_sizes=[1], tokens_per_s=[10.0])

    async def scenario():
        engine = CostModelEngine(cost)
        await engine.start()
        manager = ServerManager([engine], clock=asyncio.get_running_loop().time)
        call = asyncio.create_task(manager.generate("a", [5], SamplingParams(max_tokens=30)))
        await asyncio.sleep(1.05)  # ~10 tokens at version 0
        await manager.pause("abort")
        await manager.load_weights("sim://", b"{}", 1)
        await asyncio.sleep(5)  # paused: no progress
        await manager.resume()
        out = await call
        util = manager.utilization()
        await engine.stop()
        return out, util

    loop = VirtualClockLoop()
    try:
        out, util = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert len(out.token_ids) == 30 and out.stop_reason == "length"
    assert out.weight_versions[:10] == [0] * 10 and out.weight_versions[-19:] == [1] * 19
    assert util["engine_busy_s"] == pytest.approx(3.0, abs=0.15)  # 30 tokens at 10/s; the pause is idle
    assert util["engine_idle_fraction"] == pytest.approx(1 - 3.0 / util["manager_elapsed_s"], abs=0.03)
