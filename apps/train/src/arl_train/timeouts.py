"""The run's waits that depend on how long a prompt can take, derived once from the config.

`run_timeouts` derives the driver's step timeout, the rollouter's drain timeout, the trainer's batch
timeout and the pause RPC timeout from the longest attempt: one Harbor trial (the task set's own
timeouts, `harbor_section.trial_attempt_s`) or one generation (`rollout.generate_timeout_s`), times the
attempts a prompt may make. `run.step_timeout_s` and `run.drain_timeout_s` override what they name;
nothing else is hard-coded. The plan computes them once (`arl_train.plan`) and hands them to the actors.
"""

from __future__ import annotations

import math

import msgspec

from arl_train.harbor_section import trial_attempt_s, uses_harbor
from arl_train.package_configs import run_budget
from arl_train.sections import AppConfig

__all__ = ["RunTimeouts", "run_timeouts"]

# Slack on top of the summed worst cases (RPC round trips, scheduling, teardown).
_MARGIN_S = 60.0


class RunTimeouts(msgspec.Struct, kw_only=True, frozen=True):
    """Every wait of a run that depends on how long a prompt can take, in seconds."""

    # The longest one trial attempt (Harbor) or one generation (plain) may take.
    attempt_s: float
    # The longest one prompt's group may take (all retries included).
    prompt_s: float
    # A non-partial sync's wait for active prompts (the rollouter's drain timeout).
    drain_s: float
    # The trainer's wait for one batch of samples.
    batch_s: float
    # The driver's wait for one trainer step (batch + a drained sync + its transfers).
    step_s: float
    # The trainer's pause RPC to the rollout actor (a drain plus slack).
    pause_rpc_s: float


def run_timeouts(config: AppConfig) -> RunTimeouts:
    """Derive every prompt-length-dependent wait of the run (explicit `run.*` overrides win)."""
    run = config.run
    if uses_harbor(config):
        attempt = trial_attempt_s(config)
        attempts = config.harbor.policy.max_attempts
        backoff = config.harbor.policy.retry_backoff_sec * attempts * (attempts - 1) / 2
        prompt = attempts * attempt + backoff
    else:
        attempt = prompt = config.rollout.generate_timeout_s
    drain = run.drain_timeout_s if run.drain_timeout_s is not None else prompt + _MARGIN_S
    budget = run_budget(config)
    required = config.async_training.require_batches * config.actor.ppo_mini_batch_size
    waves = math.ceil(required / max(1, budget.max_concurrent))
    batch = max(config.trainer.batch_timeout_s, waves * prompt + _MARGIN_S)
    step = run.step_timeout_s
    if step is None:
        step = batch + drain + 2 * config.sync.timeout_s + _MARGIN_S
    return RunTimeouts(
        attempt_s=attempt,
        prompt_s=prompt,
        drain_s=drain,
        batch_s=batch,
        step_s=step,
        pause_rpc_s=drain + _MARGIN_S,
    )
