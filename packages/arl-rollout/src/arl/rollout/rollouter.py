"""The producer: feeds tasks to agent loops under the concurrency and staleness budget, emits Samples.

One prompt becomes one `Sample` with `n` responses (its GRPO group). The rollouter starts a new
prompt only while (a) it is not paused for a weight sync, (b) fewer than `max_concurrent` prompts are
generating, and (c) fewer than `max_required` prompts were started since the last sync (the
staleness budget; `reset_staleness` re-arms it after each sync). At a sync, `pause()` either aborts
in-flight generations (partial rollout: the server manager resumes them after the sync, with the new
weights) or waits for the active prompts to finish (no partial rollout).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from arl.proxy.types import SamplingParams
from arl.queue.routed_experts import pack_routes
from arl.queue.segments import pack_segments
from arl.queue.types import Response, Sample
from arl.rollout.agent_loop import AgentLoop
from arl.rollout.budget import Budget
from arl.rollout.errors import GenerateTimeoutError, RolloutError, UnknownAgentLoopError
from arl.rollout.server_manager import ServerManager
from arl.rollout.types import AgentResult, Task

log = logging.getLogger(__name__)


class SampleSink(Protocol):
    """Where finished samples go (the queue client)."""

    async def put(self, sample: Sample) -> None: ...


class RolloutStats:
    """Counters the app reports; plain attributes so they cross Ray as a dict."""

    def __init__(self, extra: Callable[[], Mapping[str, float]] | None = None) -> None:
        self._extra = extra  # more counters merged into as_dict (the server manager's utilization)
        self.started = 0
        self.produced = 0
        self.dropped_failed = 0
        self.dropped_timeout = 0  # prompts whose generation stalled past the generate timeout
        self.failed_trajectories = 0
        self.aborted_syncs = 0
        self.generated_tokens = 0
        # Trajectories trained on with another prompt than their group's first (own prompt_ids).
        self.own_prompt_responses = 0
        # Failed trajectories (not trained on) by failure kind; kept ones that ended abnormally (e.g.
        # "agent_timeout" kept, "context_length" zeroed) by kind.
        self.failed_by_kind: Counter[str] = Counter()
        self.kept_by_kind: Counter[str] = Counter()
        # Trials in which the grading saw each sign of reward hacking (AgentResult.tells), failed or kept.
        self.tells: Counter[str] = Counter()
        # Sum and count of each agent-loop phase timing (e.g. Harbor's "agent_execution"), in seconds.
        self.phase_seconds: Counter[str] = Counter()
        self.phase_count: Counter[str] = Counter()
        # Turns of the trajectories trained on (mean = turns / (produced responses)).
        self.turns = 0
        self.trained_responses = 0
        # Tool calls and proxy rebuilds of the trajectories trained on.
        self.tool_calls = 0
        self.proxy_rebuilds = 0
        # Turns generated but never delivered to the agent (arl-proxy dropped them), over every trajectory.
        self.proxy_dropped_turns = 0
        # Trajectories put into samples, their token-exact segments (more than one where the history was
        # rewritten), and tokens the engine sampled into them (each should have mask 1 in one segment).
        self.trajectories = 0
        self.segments = 0
        self.sampled_tokens = 0
        self.started_at = time.monotonic()

    def record(self, result: AgentResult) -> None:
        """Count one trajectory's failure kind and phase timings."""
        self.proxy_dropped_turns += result.dropped_turns
        self.tells.update(name for name, value in result.tells.items() if value > 0)
        if result.failed:
            self.failed_by_kind[result.failure_kind or "unknown"] += 1
        else:
            self.turns += result.num_turns
            self.trained_responses += 1
            self.tool_calls += result.tool_calls
            self.proxy_rebuilds += result.rebuilds
            if result.failure_kind:
                self.kept_by_kind[result.failure_kind] += 1
        for phase, seconds in result.timings.items():
            self.phase_seconds[phase] += seconds
            self.phase_count[phase] += 1

    def record_segments(self, response: Response, sampled_tokens: int | None) -> None:
        """Count one trajectory's segments and its trained (mask 1) and sampled tokens."""
        trained = response.num_trained
        self.trajectories += 1
        self.segments += response.num_segments
        self.generated_tokens += trained
        self.sampled_tokens += trained if sampled_tokens is None else sampled_tokens

    def as_dict(self) -> dict[str, object]:
        skip = {
            "started_at",
            "_extra",
            "failed_by_kind",
            "kept_by_kind",
            "tells",
            "phase_seconds",
            "phase_count",
        }
        extra = dict(self._extra()) if self._extra is not None else {}
        return (
            {k: v for k, v in vars(self).items() if k not in skip}
            | {
                "elapsed_s": time.monotonic() - self.started_at,
                "failed_by_kind": dict(self.failed_by_kind),
                "kept_by_kind": dict(self.kept_by_kind),
                "tells": dict(self.tells),
                "phase_mean_s": {k: self.phase_seconds[k] / self.phase_count[k] for k in self.phase_count},
                "segments_per_trajectory": self.segments / self.trajectories if self.trajectories else 0.0,
                # 1.0 when every sampled token is trained (segments on); lower when a rewrite lost some.
                "trained_token_share": self.generated_tokens / self.sampled_tokens
                if self.sampled_tokens
                else 1.0,
            }
            | extra
        )


def task_sampling_params(base: SamplingParams, task: Task) -> SamplingParams:
    """`base` with the task's own overrides, `task.metadata["sampling"]` (e.g. a per-task max_tokens
    and ignore_eos for exact-length benchmark workloads); a bad override names the task and key."""
    overrides: Any = task.metadata.get("sampling")
    if not overrides:
        return base
    if not isinstance(overrides, dict):
        raise RolloutError(
            f"task {task.id}: metadata['sampling'] must be an object, got {type(overrides).__name__}"
        )
    unknown = sorted(set(overrides) - set(SamplingParams.__struct_fields__))
    if unknown:
        raise RolloutError(f"task {task.id}: metadata['sampling'] has unknown keys {unknown}")
    try:
        return msgspec.convert(msgspec.to_builtins(base) | overrides, SamplingParams)
    except msgspec.ValidationError as exc:
        raise RolloutError(f"task {task.id}: invalid metadata['sampling'] override: {exc}") from None


class Rollouter:
    def __init__(
        self,
        *,
        tasks: Iterator[tuple[int, Task]],
        manager: ServerManager,
        sink: SampleSink,
        agent_loops: Mapping[str, AgentLoop],
        sampling_params: SamplingParams,
        n: int,
        budget: Budget,
        partial_rollout: bool,
        drain_timeout_s: float = 600.0,
    ) -> None:
        if n < 1:
            raise ValueError(f"rollout.n must be >= 1, got {n}")
        self._tasks = tasks
        self.manager = manager
        self._sink = sink
        self._agent_loops = dict(agent_loops)
        self._sampling = sampling_params
        self._n = n
        self.budget = budget
        self.partial_rollout = partial_rollout
        self._drain_timeout_s = drain_timeout_s
        self._cond = asyncio.Condition()
        self._paused = False
        self._active = 0
        self._started_since_sync = 0
        self.stats = RolloutStats(extra=getattr(manager, "utilization", None))

    # ----- the feed loop -------------------------------------------------------------------
    async def run(self) -> None:
        """Feed tasks until the dataset ends (or the caller cancels); waits for the last samples.

        A prompt that fails stops the feed and raises its own error (not a bare exception group), so
        the caller's message names the cause.
        """
        try:
            async with asyncio.TaskGroup() as group:
                for _epoch, task in self._tasks:
                    async with self._cond:
                        await self._cond.wait_for(self._may_start)
                        self._active += 1
                        self._started_since_sync += 1
                        self.stats.started += 1
                    group.create_task(self._run_prompt(task))
        except* Exception as failures:
            raise failures.exceptions[0] from failures

    def _may_start(self) -> bool:
        return (
            not self._paused
            and self._active < self.budget.max_concurrent
            and self._started_since_sync < self.budget.max_required
        )

    async def _run_prompt(self, task: Task) -> None:
        start_version = min(self.manager.weight_versions)
        started = time.perf_counter()
        produced = False
        try:
            loop = self._agent_loops.get(task.agent)
            if loop is None:
                raise UnknownAgentLoopError(
                    f"task {task.id} asks for agent loop {task.agent!r}; have {sorted(self._agent_loops)}"
                )
            uid = uuid.uuid4().hex
            request_ids = [f"{uid}-{i}" for i in range(self._n)]
            try:
                results = await self._run_group(loop, task, request_ids)
            finally:
                for rid in request_ids:
                    self.manager.forget(rid)
            sample = None
            if results is not None:
                sample = self._to_sample(uid, task, results, start_version, time.perf_counter() - started)
            if sample is not None:
                await self._sink.put(sample)
                self.stats.produced += 1
                produced = True
        finally:
            async with self._cond:
                self._active -= 1
                if not produced:
                    # A dropped prompt gives its staleness-budget slot back: the trainer still needs as
                    # many samples as before, and none may start until the next sync otherwise (which
                    # never comes if the drops used up the budget).
                    self._started_since_sync = max(0, self._started_since_sync - 1)
                self._cond.notify_all()

    async def _run_group(
        self, loop: AgentLoop, task: Task, request_ids: list[str]
    ) -> list[AgentResult] | None:
        """The group's n trajectories; None (prompt dropped, counted) when a generation stalled past its
        timeout. A failing trajectory cancels its siblings, so none is left running."""
        try:
            async with asyncio.TaskGroup() as group:
                params = task_sampling_params(self._sampling, task)
                runs = [group.create_task(loop.run(task, self.manager, params, rid)) for rid in request_ids]
        except ExceptionGroup as failures:
            timeouts, others = failures.split(GenerateTimeoutError)
            if others is not None:
                first = others.exceptions[0]
                while isinstance(first, ExceptionGroup):
                    first = first.exceptions[0]
                raise first from failures
            self.stats.dropped_timeout += 1
            log.warning("task %s: dropped, %s", task.id, timeouts.exceptions[0])
            return None
        return [r.result() for r in runs]

    def _to_sample(
        self, uid: str, task: Task, results: list[AgentResult], start_version: int, seconds: float
    ) -> Sample | None:
        ok = [r for r in results if not r.failed]
        for r in results:
            self.stats.record(r)
        self.stats.failed_trajectories += len(results) - len(ok)
        if not ok:
            self.stats.dropped_failed += 1
            log.warning("task %s: every trajectory failed (%s); no sample", task.id, results[0].error)
            return None
        if len(ok) < len(results):
            log.info(
                "task %s: %d of %d trajectories failed; training on the rest",
                task.id,
                len(results) - len(ok),
                len(results),
            )
        for r in ok:
            if r.segments and (
                r.segments[0].prompt_ids != r.prompt_ids or r.segments[0].response_ids != r.response_ids
            ):
                raise RolloutError(f"task {task.id}: an agent result's fields are not its first segment")
        # The group's prompt is the most common one; a trajectory that rendered another (a first-turn
        # overflow, a prompt showing the sandbox's hostname) carries its own.
        prompt_ids = list(Counter(tuple(r.prompt_ids) for r in ok).most_common(1)[0][0])
        own = [None if r.prompt_ids == prompt_ids else r.prompt_ids for r in ok]
        self.stats.own_prompt_responses += sum(p is not None for p in own)
        responses = [
            Response(
                response_ids=r.response_ids,
                response_mask=r.response_mask,
                response_logprobs=r.response_logprobs,
                weight_versions=r.weight_versions,
                reward=r.reward,
                finish_reason=r.finish_reason,
                num_turns=r.num_turns,
                rewards=r.rewards,
                routed_experts=pack_routes(r.routed_experts) if r.routed_experts else None,
                prompt_ids=own_prompt,
                # The trajectory's later segments (the fields above are its first).
                next_segments=pack_segments(r.segments)[1] if r.segments else [],
            )
            for r, own_prompt in zip(ok, own, strict=True)
        ]
        for r, response in zip(ok, responses, strict=True):
            self.stats.record_segments(response, r.sampled_tokens)
        return Sample(
            uid=uid,
            prompt_ids=prompt_ids,
            responses=responses,
            start_version=start_version,
            end_version=min(self.manager.weight_versions),
            task_id=task.id,
            metadata={"ground_truth": task.ground_truth}
            | ({"synthetic": True} if task.metadata.get("synthetic") else {}),
            timings={"rollout": seconds},
        )

    # ----- weight sync ----------------------------------------------------------------------
    async def pause(self) -> None:
        """Stop starting prompts; then abort in-flight generation (partial rollout) or drain it."""
        async with self._cond:
            self._paused = True
            if not self.partial_rollout:
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: self._active == 0), self._drain_timeout_s
                    )
                except TimeoutError:
                    raise RolloutError(
                        f"{self._active} prompts still active after {self._drain_timeout_s}s of draining for a sync"
                    ) from None
        if self.partial_rollout:
            self.stats.aborted_syncs += 1
        await self.manager.pause("abort" if self.partial_rollout else "wait")

    async def update_weights(
        self, sync_address: str | Sequence[str], sync_config_json: bytes, version: int
    ) -> None:
        """Every replica loads `version` from the sender at `sync_address` (or replica i from `sync_address[i]`)."""
        await self.manager.load_weights(sync_address, sync_config_json, version)

    async def resume(self, queued_samples: int | None) -> None:
        """Resume generation and re-arm the staleness budget.

        Samples produced with old weights and not yet consumed (queued or still generating) count
        against the new budget, as in the reference `reset_staleness`. `queued_samples=None` resumes
        after a pause that loaded no weights (a time-sliced engine handing the GPU back after a step
        without a sync): the budget stays as it was, since the weights did not change.
        """
        await self.manager.resume()
        async with self._cond:
            self._paused = False
            if queued_samples is not None:
                self._started_since_sync = self._active + queued_samples
            self._cond.notify_all()

    @property
    def active(self) -> int:
        return self._active
