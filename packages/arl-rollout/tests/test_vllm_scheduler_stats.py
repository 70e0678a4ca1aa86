"""The scheduler window fed by vLLM's own stats objects (as its AsyncLLM hands them to a stat logger):
preemptions counted, maxima kept and started over at each read; several replicas' reads as one window
per step, a replica that missed a read losing no preemption."""

import pytest

from arl.rollout.engines.vllm_scheduler_stats import ReplicaWindows, SchedulerWindow, merge_windows

stats = pytest.importorskip("vllm.v1.metrics.stats")


def _iteration(preempted: int):
    it = stats.IterationStats()
    it.num_preempted_reqs = preempted
    return it


def test_the_window_sums_preemptions_keeps_maxima_and_starts_over_when_read():
    window = SchedulerWindow()
    logger = window.logger_factory()(None, 0)  # what vLLM's StatLoggerManager constructs per engine
    logger.record(
        stats.SchedulerStats(num_running_reqs=5, num_waiting_reqs=0, kv_cache_usage=0.40), _iteration(0)
    )
    logger.record(
        stats.SchedulerStats(num_running_reqs=9, num_waiting_reqs=3, kv_cache_usage=0.97), _iteration(2)
    )
    logger.record(
        stats.SchedulerStats(num_running_reqs=7, num_waiting_reqs=1, kv_cache_usage=0.90), _iteration(1)
    )
    logger.record(None, None)  # vLLM passes None for what it did not collect this step
    assert window.pop() == {
        "preempted_total": 3.0,
        "running_max": 9.0,
        "waiting_max": 3.0,
        "kv_cache_usage_max": 0.97,
    }
    logger.record(None, _iteration(1))
    assert window.pop() == {
        "preempted_total": 4.0,
        "running_max": 0.0,
        "waiting_max": 0.0,
        "kv_cache_usage_max": 0.0,
    }


def test_replicas_merge_into_one_window():
    a = {"preempted": 2.0, "running_max": 9.0, "waiting_max": 0.0, "kv_cache_usage_max": 0.5}
    b = {"preempted": 1.0, "running_max": 4.0, "waiting_max": 6.0, "kv_cache_usage_max": 0.99}
    assert merge_windows([a, b]) == {
        "preempted": 3.0,
        "running_max": 9.0,
        "waiting_max": 6.0,
        "kv_cache_usage_max": 0.99,
    }
    assert merge_windows([]) == {}


def test_each_step_counts_the_preemptions_since_each_replicas_previous_read():
    windows = ReplicaWindows()

    def read(total, running):
        return {
            "preempted_total": total,
            "running_max": running,
            "waiting_max": 0.0,
            "kv_cache_usage_max": 0.5,
        }

    assert windows.merge({0: read(3, 8), 1: read(1, 4)}) == {
        "preempted": 4.0,
        "running_max": 8.0,
        "waiting_max": 0.0,
        "kv_cache_usage_max": 0.5,
    }
    assert windows.merge({0: read(5, 6)})["preempted"] == 2.0  # replica 1 did not answer this step
    assert windows.merge({0: read(5, 6), 1: read(4, 4)})["preempted"] == 3.0  # ... and reports its 3 now
    assert windows.merge({}) == {}
