"""The consumer loop: take samples off the queue, update the policy, publish weights every few steps.

One step consumes `required = require_batches × ppo_mini_batch_size` samples (each a prompt with n
responses) and makes `require_batches` optimizer updates. Every `trigger_parameter_sync_step` steps it
syncs: pause the rollout side, stream the weights through arl-sync into the engines, resume and
re-arm the rollout staleness budget. Samples whose oldest token is more than `max_version_lag`
versions old are dropped (or kept) and counted, never silently lost.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from arl.queue.types import Sample
from arl.trainer.batch import assemble_batch, trajectory_rewards
from arl.trainer.config import TrainerConfig
from arl.trainer.dynamic_sampling import filter_zero_variance_groups, groups_of_one
from arl.trainer.engine import PackedPolicy
from arl.trainer.errors import StarvedError
from arl.trainer.publisher import RolloutControl, WeightPublisher
from arl.trainer.router_replay import routes_for_batch


class SampleSource(Protocol):
    async def get_batch(self, n: int, timeout: float | None = None) -> list[Sample]: ...

    async def size(self) -> int: ...


class Trainer:
    def __init__(
        self,
        policy: PackedPolicy,
        source: SampleSource,
        rollout: RolloutControl,
        publisher: WeightPublisher,
        config: TrainerConfig,
        *,
        pad_token_id: int,
    ) -> None:
        self.policy = policy
        self.source = source
        self.rollout = rollout
        self.publisher = publisher
        self.config = config
        self.pad_token_id = pad_token_id
        self.step = 0
        self.version = 0  # weight version the rollout side holds (bumped by every sync)
        self.samples_seen = 0
        self.dropped_version_lag = 0
        self.dynamic_sampling_dropped = 0  # groups dropped by DAPO dynamic sampling (counted, never silent)
        self.dynamic_sampling_dropped_single = 0  # of those, groups of one (docs/design/loss-conventions.md)
        self._last_step_end = time.perf_counter()

    def state(self) -> dict[str, int]:
        """What a checkpoint needs to resume this loop."""
        return {"step": self.step, "version": self.version, "samples_seen": self.samples_seen}

    def restore(self, state: dict[str, int]) -> None:
        self.step = state["step"]
        self.version = state["version"]
        self.samples_seen = state["samples_seen"]

    @property
    def required(self) -> int:
        return self.config.require_batches * self.config.ppo_mini_batch_size

    async def _collect(self) -> tuple[list[Sample], int]:
        """`required` samples within the version-lag bound; returns them and how many were over it."""
        kept: list[Sample] = []
        over = 0
        deadline = time.monotonic() + self.config.batch_timeout_s
        while len(kept) < self.required:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StarvedError(
                    f"waited {self.config.batch_timeout_s}s for {self.required} samples, got {len(kept)}"
                )
            got = await self.source.get_batch(self.required - len(kept), timeout=remaining)
            if self.config.algorithm.dynamic_sampling:  # DAPO: groups with one reward teach nothing
                result = filter_zero_variance_groups(got)
                self.dynamic_sampling_dropped += len(got) - len(result.kept)
                self.dynamic_sampling_dropped_single += result.dropped_single_response
                got = result.kept
            for sample in got:
                lag = self.version - sample.min_token_version()
                if self.config.max_version_lag is not None and lag > self.config.max_version_lag:
                    over += 1
                    if self.config.on_version_lag == "drop":
                        continue
                kept.append(sample)
        return kept, over

    async def train_step(self) -> dict[str, Any]:
        """One step (and a sync when due); returns the step's metrics."""
        wait_start = time.perf_counter()
        samples, over_lag = await self._collect()
        wait_s = time.perf_counter() - wait_start
        if self.config.on_version_lag == "drop":
            self.dropped_version_lag += over_lag
        batch = assemble_batch(samples, self.pad_token_id)
        self.policy.version = self.version  # the weights' version, for version-aware proximal modes
        n_per_prompt = batch.input_ids.shape[0] / len(samples)
        train_start = time.perf_counter()
        # MoE engine routes; None when dense
        routes = routes_for_batch(samples, width=batch.input_ids.shape[1])
        metrics = self.policy.train_step(
            batch, mini_batch_rows=max(1, int(self.config.ppo_mini_batch_size * n_per_prompt)), routes=routes
        )
        train_s = time.perf_counter() - train_start
        self.step += 1
        self.samples_seen += len(samples)
        staleness = [self.version - s.min_token_version() for s in samples]
        sampled_tokens = int(batch.loss_mask.sum().item())
        metrics.update(
            step=self.step,
            version=self.version,
            samples_seen=self.samples_seen,
            # Over trajectories (a rewritten one has several rows, one per segment).
            reward_mean=trajectory_rewards(batch).mean().item(),
            reward_max=trajectory_rewards(batch).max().item(),
            segments_per_trajectory=batch.input_ids.shape[0] / trajectory_rewards(batch).shape[0],
            response_length_mean=batch.response_lengths.float().mean().item(),
            staleness_mean=sum(staleness) / len(staleness),
            staleness_max=max(staleness),
            mixed_version_samples=sum(
                # set() of each packed array first: a few distinct versions, no Python loop per token.
                len({v for r in s.responses for v in set(r.weight_versions) if v >= 0}) > 1
                for s in samples
            ),
            over_version_lag=over_lag,
            dropped_version_lag_total=self.dropped_version_lag,
            dynamic_sampling_dropped_total=self.dynamic_sampling_dropped,
            groups_of_one_dynamic_sampling_total=self.dynamic_sampling_dropped_single,
            **groups_of_one(
                samples
            ),  # trained groups of one (advantage 0), and those that lost members to failures
            wait_s=wait_s,
            train_s=train_s,
            sync_s=0.0,
        )
        if self.step % self.config.trigger_parameter_sync_step == 0:
            metrics.update(await self.sync())
        now = time.perf_counter()
        step_s = now - self._last_step_end
        self._last_step_end = now
        metrics.update(
            step_s=step_s, samples_per_s=len(samples) / step_s, sampled_tokens_per_s=sampled_tokens / step_s
        )
        return metrics

    async def sync(self) -> dict[str, float]:
        """Pause rollout, push weights as version+1, resume; returns timing metrics."""
        start = time.perf_counter()
        await self.rollout.pause()
        paused = time.perf_counter()
        new_version = self.version + 1
        stats = await self.publisher.publish(
            self.policy.named_parameters_for_sync(), new_version, self.rollout
        )
        self.version = new_version
        transferred = time.perf_counter()
        await self.rollout.resume(await self.source.size())
        end = time.perf_counter()
        return {
            "sync_s": end - start,
            "sync_pause_s": paused - start,
            "sync_transfer_s": transferred - paused,
            "sync_resume_s": end - transferred,
            "sync_gbps": stats.gbps,
            "version": self.version,
        }
