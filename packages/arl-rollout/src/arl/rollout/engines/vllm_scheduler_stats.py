"""What a vLLM replica's scheduler did between two reads: requests preempted, the most requests running
and waiting at once, the highest KV-cache use.

A rollout-bound run (the replica generates all the time and the trainer waits) needs to know whether
the replica's batch was limited by its KV cache: preempted requests are recomputed from their prompt,
and waiting ones are not decoded at all. vLLM reports these per engine step to the stat loggers of its
`AsyncLLM` (in the process that holds it); `SchedulerWindow.logger_factory()` is such a logger, and
`pop()` returns the maxima since the last call (and starts new ones) with the running total of
preemptions. `ReplicaWindows` turns the replicas' reads into one window per step: preemptions since
the previous read of each replica come from its running total, so a read that timed out loses none.
vLLM calls `SchedulerStats` and `IterationStats` unstable interfaces: every field is read with a
default, so a renamed field reads as 0 instead of failing the replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SchedulerWindow:
    """Counters of one replica's scheduler since the last `pop()`."""

    def __init__(self) -> None:
        self.preempted_total = 0
        self._reset()

    def _reset(self) -> None:
        self.running_max = 0
        self.waiting_max = 0
        self.kv_cache_usage_max = 0.0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.running_max = max(self.running_max, int(getattr(scheduler_stats, "num_running_reqs", 0)))
            self.waiting_max = max(self.waiting_max, int(getattr(scheduler_stats, "num_waiting_reqs", 0)))
            usage = float(getattr(scheduler_stats, "kv_cache_usage", 0.0))
            self.kv_cache_usage_max = max(self.kv_cache_usage_max, usage)
        if iteration_stats is not None:
            self.preempted_total += int(getattr(iteration_stats, "num_preempted_reqs", 0))

    def pop(self) -> dict[str, float]:
        """`preempted_total` (since the engine started) and the maxima since the last call
        (`running_max`, `waiting_max`, `kv_cache_usage_max` in [0, 1]), which then start over."""
        out = {
            "preempted_total": float(self.preempted_total),
            "running_max": float(self.running_max),
            "waiting_max": float(self.waiting_max),
            "kv_cache_usage_max": self.kv_cache_usage_max,
        }
        self._reset()
        return out

    def logger_factory(self) -> Callable[..., Any]:
        """A factory for `AsyncLLM(stat_loggers=[...])`: vLLM calls it once per engine core, each logger
        feeding this window. With `disable_log_stats` vLLM then collects stats for it alone (its own
        periodic log lines stay off)."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        window = self

        class _WindowLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                window.record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self) -> None:
                pass

        return _WindowLogger


class ReplicaWindows:
    """One window over several replicas, read once per step: `preempted` summed (each replica's since
    its previous read, from its running total), the maxima the largest of any replica."""

    def __init__(self) -> None:
        self._preempted_seen: dict[int, float] = {}

    def merge(self, reads: dict[int, dict[str, float]]) -> dict[str, float]:
        """`reads`: replica index → its `SchedulerWindow.pop()`; a replica missing from it (it did not
        answer in time) reports its preemptions at its next read. {} when no replica reported."""
        windows = []
        for replica, read in reads.items():
            window = dict(read)
            total = window.pop("preempted_total", 0.0)
            window["preempted"] = total - self._preempted_seen.get(replica, 0.0)
            self._preempted_seen[replica] = total
            windows.append(window)
        return merge_windows(windows)


def merge_windows(windows: list[dict[str, float]]) -> dict[str, float]:
    """Several replicas' windows as one: preemptions summed, the maxima the largest of any replica."""
    if not windows:
        return {}
    keys = {k for w in windows for k in w}
    return {k: (sum if k == "preempted" else max)(w.get(k, 0.0) for w in windows) for k in sorted(keys)}
