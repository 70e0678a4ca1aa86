"""`HarborAgentLoop`: one task becomes one Harbor trial whose agent talks to the arl proxy.

Per attempt: open a proxy session (its base URL is the agent's OpenAI-compatible endpoint; the proxy
forwards to the rollout's `Generator` under this trajectory's request id), build a `TrialConfig`, run
`Trial.create(cfg)` / `trial.run()` under `HarborConfig.trial_timeout_sec`, pop the session's token-exact
`Trajectory`, classify the outcome (`arl.harbor.policy`) and either accept it, retry with a new Trial,
or give up with `AgentResult(failed=True)`. Registered as agent loop "harbor".

By default each attempt gets its own `ChatProxy` (an aiohttp server on a free port, started and stopped
around the trial) bound to the generator, request id and sampling params that `run` receives, so the
rollout's sampling settings govern every turn. A long-lived shared proxy may be passed instead; its
own generator is then used and the sampling settings reach it only through the agent's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.result import TimingInfo, TrialResult
from harbor.trial.trial import Trial

from arl.harbor.errors import HarborConfigError, HarborError
from arl.harbor.policy import (
    AGENT_BROKE_VERIFIER,
    artifact_failures,
    broken_verifier_cause,
    classify,
    decide,
    grades_own_harness,
    harness_failure,
    network_attempts,
    reward_for,
    tells,
    verifier_output,
)
from arl.harbor.types import AttemptRecord, FailureKind, HarborConfig
from arl.proxy.generator import Generator
from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.agent_loop import register_agent_loop
from arl.rollout.types import AgentResult, Task

logger = logging.getLogger(__name__)

# Agents that call no model (they get no endpoint settings at all).
_NO_MODEL_AGENTS = frozenset({"oracle", "nop"})
# Agents that run LiteLLM in this process and take api_base/model_info/rollout-details kwargs.
_HOST_LITELLM_AGENTS = frozenset({"terminus-2", "terminus"})
_TIMING_PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")


def litellm_model_name(name: str) -> str:
    """`hosted_vllm/<name>` with `name` reduced to LiteLLM's allowed characters (one '/', < 64 chars)."""
    canonical = re.sub(r"[^A-Za-z0-9._-]", "-", name.rsplit("/", 1)[-1])[:63] or "policy"
    return f"hosted_vllm/{canonical}"


class _BoundGenerator:
    """The generator a per-trial proxy forwards to: the rollout's, under this trajectory's request id.

    The rollout's sampling params win (the trained policy's temperature/top-p/top-k are what the log
    probs mean); `max_tokens` is the smaller of both (the proxy may lower it to fit the context), and
    the agent's stop strings/ids are added to the rollout's.
    """

    def __init__(self, inner: Generator, request_id: str, sampling_params: SamplingParams) -> None:
        self._inner = inner
        self._request_id = request_id
        self._params = sampling_params

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        p = self._params
        merged = msgspec.structs.replace(
            p,
            max_tokens=min(p.max_tokens, sampling_params.max_tokens),
            stop=list(dict.fromkeys([*p.stop, *sampling_params.stop])),
            stop_token_ids=list(dict.fromkeys([*p.stop_token_ids, *sampling_params.stop_token_ids])),
        )
        return await self._inner.generate(self._request_id, prompt_ids, merged)


def _seconds(timing: TimingInfo | None) -> float | None:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return None
    return (timing.finished_at - timing.started_at).total_seconds()


def trial_timings(result: TrialResult) -> dict[str, float]:
    """Seconds per Harbor phase (environment_setup, agent_setup, agent_execution, verifier, trial)."""
    timings = {}
    for phase in _TIMING_PHASES:
        seconds = _seconds(getattr(result, phase))
        if seconds is not None:
            timings[phase] = seconds
    total = _seconds(TimingInfo(started_at=result.started_at, finished_at=result.finished_at))
    if total is not None:
        timings["trial"] = total
    return timings


class _EmptyTrajectory(msgspec.Struct, kw_only=True):
    """The trajectory of an agent that called no model (oracle, nop)."""

    prompt_ids: list[int] = msgspec.field(default_factory=list)
    response_ids: list[int] = msgspec.field(default_factory=list)
    response_mask: list[int] = msgspec.field(default_factory=list)
    response_logprobs: list[float] = msgspec.field(default_factory=list)
    num_turns: int = 0
    finish_reason: str = "stop"
    messages: list[dict[str, Any]] = msgspec.field(default_factory=list)
    rebuilds: int = 0
    dropped_turns: int = 0


_EMPTY = _EmptyTrajectory()


class _Attempt(msgspec.Struct, kw_only=True):
    """What one attempt left behind."""

    kind: FailureKind
    result: TrialResult | None = None
    trajectory: Any = None
    error: str = ""
    trial_dir: Path | None = None
    wall: float = 0.0


class _ProxyUnavailable(Exception):
    """The attempt's proxy (the agent's model endpoint) did not start: an attempt of kind model_provider."""


class HarborAgentLoop:
    """Runs a `Task` whose `metadata[config.task_path_key]` is a Harbor task directory as a trial.

    `tokenizer` is the policy's tokenizer (an object, or a name/path for `AutoTokenizer`), used by the
    per-trial proxies (not needed for the model-free agents oracle and nop); `proxy`, when given, is a
    started shared `ChatProxy` used instead of them.
    """

    def __init__(
        self, config: HarborConfig | None = None, *, tokenizer: Any = None, proxy: Any = None
    ) -> None:
        self.config = config or HarborConfig()
        self._tokenizer = tokenizer
        self._shared_proxy = proxy

    def _get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise HarborConfigError(
                f"agent {self.config.agent!r} calls a model: HarborAgentLoop needs a tokenizer"
            )
        if isinstance(self._tokenizer, str | Path):
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self._tokenizer))
        return self._tokenizer

    # -- the AgentLoop protocol --------------------------------------------------------------------

    async def run(
        self, task: Task, generator: Generator, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult:
        task_path = task.metadata.get(self.config.task_path_key)
        if not task_path:
            raise HarborConfigError(f"task {task.id!r} has no metadata[{self.config.task_path_key!r}]")
        policy = self.config.policy
        history: list[AttemptRecord] = []
        retried_wall = 0.0
        attempt = 0
        while True:
            attempt += 1
            outcome = await self._attempt(task, Path(task_path), generator, sampling_params, request_id)
            decision, action = decide(policy, outcome.kind, attempt)
            history.append(
                AttemptRecord(
                    attempt=attempt,
                    kind=outcome.kind,
                    action=action,
                    error=outcome.error,
                    trial_dir=str(outcome.trial_dir or ""),
                )
            )
            logger.info(
                "harbor task %s attempt %d: %s -> %s%s",
                task.id,
                attempt,
                outcome.kind,
                decision,
                f" ({outcome.error[:200]})" if outcome.error else "",
            )
            if decision == "accept":
                result = self._accepted(outcome, action, retried_wall)
            elif decision == "fail":
                result = self._failed(outcome, history, retried_wall)
            else:
                retried_wall += outcome.wall
            self._cleanup(outcome)
            if decision != "retry":
                return result
            await asyncio.sleep(policy.retry_backoff_sec * attempt)

    # -- one attempt -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _proxy(
        self, generator: Generator, sampling_params: SamplingParams, request_id: str
    ) -> AsyncIterator[Any]:
        if self._shared_proxy is not None:
            yield self._shared_proxy
            return
        if not self._calls_model():
            yield None  # oracle / nop / scripted agents call no model: no endpoint, empty trajectory
            return
        from arl.proxy import ChatProxy, ProxyConfig

        bound = _BoundGenerator(generator, request_id, sampling_params)
        # One context budget: the proxy refuses what the agent was told does not fit.
        proxy = ChatProxy(
            self._get_tokenizer(), bound, msgspec.convert(self.config.proxy_settings(), ProxyConfig)
        )
        try:
            await asyncio.wait_for(proxy.start(), self.config.proxy_timeout_sec)
        except TimeoutError:  # the agent's model endpoint is down: the policy's model_provider kind
            raise _ProxyUnavailable(
                f"the arl proxy did not start within harbor.proxy_timeout_sec={self.config.proxy_timeout_sec:g}s"
            ) from None
        try:
            yield proxy
        finally:
            try:
                await asyncio.wait_for(proxy.stop(), self.config.proxy_timeout_sec)
            except TimeoutError:  # the trial is over; a slow stop must not fail the run that owns it
                logger.warning(
                    "the arl proxy did not stop within %ss; its server is left to the event loop",
                    self.config.proxy_timeout_sec,
                )

    async def _attempt(
        self,
        task: Task,
        task_path: Path,
        generator: Generator,
        sampling_params: SamplingParams,
        request_id: str,
    ) -> _Attempt:
        cfg = self.config
        trial_name = f"{re.sub(r'[^A-Za-z0-9._-]', '_', task.id)[:48]}__{uuid.uuid4().hex[:8]}"
        trial_dir = Path(cfg.trials_dir) / trial_name
        started = time.monotonic()
        trial_timeout = self.trial_timeout_sec(task_path)
        try:
            return await self._attempt_through_proxy(
                task,
                task_path,
                trial_name,
                trial_dir,
                started,
                trial_timeout,
                generator,
                sampling_params,
                request_id,
            )
        except _ProxyUnavailable as e:
            return _Attempt(
                kind="model_provider", error=str(e), trial_dir=trial_dir, wall=time.monotonic() - started
            )

    async def _attempt_through_proxy(
        self,
        task: Task,
        task_path: Path,
        trial_name: str,
        trial_dir: Path,
        started: float,
        trial_timeout: float,
        generator: Generator,
        sampling_params: SamplingParams,
        request_id: str,
    ) -> _Attempt:
        cfg = self.config
        async with self._proxy(generator, sampling_params, request_id) as proxy:
            session = None
            if proxy is not None:
                session = proxy.open_session(
                    trajectory_dir=str(trial_dir / "proxy") if cfg.keep_trial_dirs else None
                )
            base_url = session.base_url if session is not None else ""
            trajectory = None
            trial: Trial | None = None
            outcome: _Attempt
            try:
                async with asyncio.timeout(trial_timeout):
                    try:
                        trial_config = self.trial_config(task_path, trial_name, base_url, sampling_params)
                        trial = await Trial.create(trial_config)
                    except Exception as e:  # noqa: BLE001 - any create failure is the task's/config's
                        outcome = _Attempt(kind="invalid_task", error=f"{type(e).__name__}: {e}")
                    else:
                        result = await trial.run()
                        outcome = _Attempt(kind=classify(result, cfg.reward_key), result=result)
                        if result.exception_info is not None:
                            info = result.exception_info
                            outcome.error = f"{info.exception_type}: {info.exception_message}"
                        blocked = network_attempts(trial_dir, result)
                        if blocked:  # its reward is about the missing network, not the solution
                            outcome.kind = "verifier_network"
                            outcome.error = (
                                "the verifier tried to reach the network, which the sandbox does not have "
                                f"(DNS lookups: {', '.join(blocked[:5])}); its reward is not used. "
                                f"{outcome.error}"
                            ).strip()
                        else:
                            self._check_verifier(outcome, result, trial_dir)
            except TimeoutError:
                outcome = _Attempt(
                    kind="trial_timeout",
                    result=getattr(trial, "_result", None),  # None if it timed out before run() began
                    error=f"trial exceeded its timeout of {trial_timeout:.0f}s",
                )
            finally:
                if session is not None:
                    trajectory = proxy.pop_session(session.id)
        outcome.trajectory = trajectory
        outcome.trial_dir = trial_dir
        outcome.wall = time.monotonic() - started
        return outcome

    def _check_verifier(self, outcome: _Attempt, result: TrialResult, trial_dir: Path) -> None:
        """A verifier that could not run never yields a reward: reclassify its 0, name its cause. One that
        the agent's change broke yields the agent's 0 (`agent_broke_verifier`)."""
        if result.verifier is None:
            return
        rewards = result.verifier_result.rewards if result.verifier_result is not None else None
        lost = artifact_failures(trial_dir)
        if lost and outcome.kind in ("ok", "verifier_error", "no_reward"):
            # Graded without the agent's change (environments carry what the agent removed as empty).
            outcome.kind = "sandbox"
            outcome.error = f"the agent's environment did not hand over {', '.join(lost)} for grading"
            return
        if outcome.kind == "ok" and (rewards or {}).get(AGENT_BROKE_VERIFIER):
            outcome.kind = "agent_broke_verifier"
            cause = broken_verifier_cause(trial_dir) or "no cause given"
            outcome.error = f"the agent's change broke the verifier: {cause}"
            return
        if outcome.kind == "ok" and not grades_own_harness(rewards):
            value = (rewards or {}).get(self.config.reward_key)
            if isinstance(value, int | float) and value == 0:
                line = harness_failure(verifier_output(trial_dir))
                if line is not None:
                    outcome.kind = "verifier_harness"
                    outcome.error = f"the verifier's harness could not run ({line}); its reward 0 is not used"
        elif outcome.kind in ("verifier_error", "verifier_timeout"):
            output = verifier_output(trial_dir)
            line = harness_failure(output)
            if line is None:
                tail = [ln.strip() for ln in output.splitlines() if ln.strip()]
                line = tail[-1][:300] if tail else None
            if line:  # the cause first: the failure summary keeps only the start of each attempt's error
                outcome.error = f"[verifier output: {line}] {outcome.error}"

    def _calls_model(self) -> bool:
        """False for Harbor's oracle and nop, and for import-path agents whose class sets CALLS_MODEL = False."""
        cfg = self.config
        if cfg.agent_import_path is None:
            return cfg.agent not in _NO_MODEL_AGENTS
        import importlib

        module, _, name = cfg.agent_import_path.partition(":")
        try:
            agent_cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return True  # Harbor reports the bad import path in the trial
        return bool(getattr(agent_cls, "CALLS_MODEL", True))

    def trial_timeout_sec(self, task_path: Path) -> float:
        """The ceiling on one attempt: `trial_timeout_sec`, else derived from the task's own timeouts."""
        if self.config.trial_timeout_sec is not None:
            return self.config.trial_timeout_sec
        from arl.harbor.tasks import task_timeout_sec, validate_task

        return task_timeout_sec(
            validate_task(task_path),
            multiplier=self.config.timeout_multiplier_max(),
            agent_timeout_sec=self.config.agent_timeout_sec,
        )

    def trial_config(
        self, task_path: Path, trial_name: str, base_url: str, sampling_params: SamplingParams
    ) -> TrialConfig:
        """The Harbor `TrialConfig` of one attempt whose agent talks to `base_url`."""
        cfg = self.config
        agent_kwargs: dict[str, Any] = {}
        model_name: str | None = None
        base_url_field: str | None = None
        agent_name = cfg.agent if cfg.agent_import_path is None else None
        if self._calls_model():
            model_name = litellm_model_name(cfg.model_name)
            if agent_name in _HOST_LITELLM_AGENTS:
                agent_kwargs = {
                    "api_base": base_url,
                    "model_info": {
                        "max_input_tokens": cfg.max_input_tokens,
                        "max_output_tokens": cfg.max_output_tokens,
                        "input_cost_per_token": 0.0,
                        "output_cost_per_token": 0.0,
                    },
                    "collect_rollout_details": True,
                    # Summarisation rewrites history (the trajectory would no longer be one sequence);
                    # asciinema recording needs an install step and is of no use to training.
                    "enable_summarize": False,
                    "record_terminal_session": False,
                    "temperature": sampling_params.temperature,
                    "llm_call_kwargs": {"max_tokens": sampling_params.max_tokens},
                }
                if cfg.max_turns is not None:
                    agent_kwargs["max_turns"] = cfg.max_turns
                    agent_kwargs["suppress_max_turns_warning"] = True
            else:
                base_url_field = base_url  # installed agents: Harbor passes it as the agent's endpoint
        agent_kwargs.update(cfg.agent_kwargs)
        if cfg.environment_type is not None:
            environment = EnvironmentConfig(type=cfg.environment_type)
        else:
            environment = EnvironmentConfig(import_path=cfg.environment_import_path)
        environment.delete = cfg.delete_environment
        environment.kwargs = dict(cfg.environment_kwargs)
        environment.env = dict(cfg.environment_env)
        environment.override_cpus = cfg.override_cpus
        environment.override_memory_mb = cfg.override_memory_mb
        return TrialConfig(
            task=TaskConfig(path=task_path),
            trial_name=trial_name,
            trials_dir=Path(cfg.trials_dir),
            timeout_multiplier=cfg.timeout_multiplier,
            agent_timeout_multiplier=cfg.agent_timeout_multiplier,
            verifier_timeout_multiplier=cfg.verifier_timeout_multiplier,
            agent_setup_timeout_multiplier=cfg.agent_setup_timeout_multiplier,
            environment_build_timeout_multiplier=cfg.environment_build_timeout_multiplier,
            agent=AgentConfig(
                name=agent_name,
                import_path=cfg.agent_import_path,
                model_name=model_name,
                base_url=base_url_field,
                kwargs=agent_kwargs,
                env=dict(cfg.agent_env),
                override_timeout_sec=cfg.agent_timeout_sec,
            ),
            environment=environment,
        )

    # -- results -----------------------------------------------------------------------------------

    def _accepted(self, outcome: _Attempt, action: str, retried_wall: float) -> AgentResult:
        traj = outcome.trajectory if outcome.trajectory is not None else _EMPTY
        result = outcome.result
        rewards: dict[str, float] = {}
        if result is not None and result.verifier_result is not None:
            for key, value in (result.verifier_result.rewards or {}).items():
                if isinstance(value, int | float):
                    rewards[key] = float(value)
        finish_reason = getattr(traj, "finish_reason", None) or "stop"
        if outcome.kind in ("context_length", "output_length"):
            finish_reason = "length"
        timings = trial_timings(result) if result is not None else {}
        if retried_wall:
            timings["retried"] = retried_wall
        # The flat fields are the first segment; every segment travels (a rewritten history starts a new one).
        segments = list(getattr(traj, "segments", None) or [])
        first = segments[0] if segments else traj
        return AgentResult(
            prompt_ids=list(first.prompt_ids),
            response_ids=list(first.response_ids),
            response_mask=list(first.response_mask),
            response_logprobs=list(first.response_logprobs),
            weight_versions=list(getattr(first, "weight_versions", None) or [-1] * len(first.response_ids)),
            segments=segments if len(segments) > 1 else [],
            sampled_tokens=getattr(traj, "generated_tokens", None),
            reward=reward_for(action, result, self.config.reward_key),  # type: ignore[arg-type]
            finish_reason=finish_reason,
            num_turns=int(traj.num_turns),
            tool_calls=sum(
                len(m.get("tool_calls") or []) for m in traj.messages if m.get("role") == "assistant"
            ),
            rebuilds=int(traj.rebuilds),
            dropped_turns=int(traj.dropped_turns),
            rewards=rewards,
            routed_experts=getattr(first, "routed_experts", None),
            timings=timings,
            error=outcome.error,
            failure_kind="" if outcome.kind == "ok" else outcome.kind,
            tells=self._tells(outcome),
        )

    def _failed(self, outcome: _Attempt, history: list[AttemptRecord], retried_wall: float) -> AgentResult:
        summary = "; ".join(f"attempt {h.attempt}: {h.kind} ({h.error[:300]})" for h in history)
        timings = trial_timings(outcome.result) if outcome.result is not None else {}
        timings["retried"] = retried_wall + outcome.wall
        traj = outcome.trajectory
        return AgentResult(
            prompt_ids=[],
            response_ids=[],
            response_mask=[],
            response_logprobs=[],
            weight_versions=[],
            reward=0.0,
            num_turns=int(getattr(traj, "num_turns", 0) or 0),
            dropped_turns=int(getattr(traj, "dropped_turns", 0) or 0),
            timings=timings,
            failed=True,
            failure_kind=outcome.kind,
            error=f"harbor trial failed after {len(history)} attempt(s): {summary}",
            tells=self._tells(outcome),
        )

    @staticmethod
    def _tells(outcome: _Attempt) -> dict[str, float]:
        return tells(outcome.result, outcome.trial_dir) if outcome.trial_dir is not None else {}

    def _cleanup(self, outcome: _Attempt) -> None:
        if not self.config.keep_trial_dirs and outcome.trial_dir is not None:
            shutil.rmtree(outcome.trial_dir, ignore_errors=True)


def make_harbor_agent_loop(
    *,
    tokenizer: Any = None,
    config: HarborConfig | dict[str, Any] | None = None,
    proxy: Any = None,
    **overrides: Any,
) -> HarborAgentLoop:
    """Factory registered as agent loop "harbor": `config` (struct or dict) with field `overrides`."""
    if isinstance(config, HarborConfig):
        fields = msgspec.to_builtins(config)
    else:
        fields = dict(config or {})
    fields.update(overrides)
    try:
        harbor_config = msgspec.convert(fields, HarborConfig)
    except (msgspec.ValidationError, ValueError) as e:
        raise HarborConfigError(f"invalid harbor config: {e}") from e
    return HarborAgentLoop(harbor_config, tokenizer=tokenizer, proxy=proxy)


def check_harbor_config(config: HarborConfig) -> None:
    """Fail at start, naming the field, when the agent or the environment cannot be built.

    Checks that `agent` is one of Harbor's agent names (or `agent_import_path` imports to a class),
    that `environment_type` is one of Harbor's environment types (or `environment_import_path` imports
    to a `BaseEnvironment` subclass), and runs the environment class's `preflight()` when it has one
    (the local sandbox checks root, namespaces and tools there).
    """
    import importlib

    from harbor.environments.base import BaseEnvironment
    from harbor.models.agent.name import AgentName
    from harbor.models.environment_type import EnvironmentType

    def load(path: str, field: str) -> Any:
        module, _, name = path.partition(":")
        if not module or not name:
            raise HarborConfigError(f"harbor.{field} must look like 'pkg.module:Class', got {path!r}")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise HarborConfigError(f"harbor.{field} = {path!r} does not import: {e}") from None

    if config.agent_import_path is not None:
        if not isinstance(load(config.agent_import_path, "agent_import_path"), type):
            raise HarborConfigError(f"harbor.agent_import_path = {config.agent_import_path!r} is not a class")
    elif config.agent not in {a.value for a in AgentName}:
        raise HarborConfigError(
            f"harbor.agent = {config.agent!r} is not a Harbor agent; choose one of "
            f"{sorted(a.value for a in AgentName)} or set harbor.agent_import_path"
        )
    if config.environment_type is not None:
        if config.environment_type not in {e.value for e in EnvironmentType}:
            raise HarborConfigError(
                f"harbor.environment_type = {config.environment_type!r} is not a Harbor environment; choose one "
                f"of {sorted(e.value for e in EnvironmentType)} or set harbor.environment_import_path"
            )
        if config.environment_type == "docker":
            from arl.harbor.docker_environment import docker_preflight

            try:
                docker_preflight()
            except HarborError as e:
                raise HarborConfigError(f"harbor.environment_type = 'docker' cannot run here: {e}") from None
        return
    if config.environment_import_path is None:
        raise HarborConfigError("set harbor.environment_type or harbor.environment_import_path")
    cls = load(config.environment_import_path, "environment_import_path")
    if not (isinstance(cls, type) and issubclass(cls, BaseEnvironment)):
        raise HarborConfigError(
            f"harbor.environment_import_path = {config.environment_import_path!r} is not a Harbor BaseEnvironment"
        )
    preflight = getattr(cls, "preflight", None)
    if preflight is not None:
        try:
            preflight(**config.environment_kwargs)
        except Exception as e:  # noqa: BLE001 - any preflight failure is a misconfiguration
            raise HarborConfigError(
                f"harbor environment {config.environment_import_path!r} cannot run here: {e}"
            ) from None


register_agent_loop("harbor", make_harbor_agent_loop)
