"""Config structs of arl-harbor: how a Harbor trial is run as an agent loop, and what each failure means.

Everything is a `msgspec.Struct` so that it loads from TOML (`msgspec.toml.decode(..., type=HarborConfig)`)
and converts from plain dicts (`msgspec.convert(d, HarborConfig)`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

LOCAL_SANDBOX_IMPORT_PATH = "arl.harbor.environment:LocalSandboxEnvironment"

# What to do with a trial that ended in a given way:
#   "retry": discard it and run a new Trial (a fresh sandbox and proxy session) while attempts remain;
#            when none remain the result is failed (never trained on).
#   "keep":  keep the trajectory; reward is the verifier's if it ran, else 0.0.
#   "zero":  keep the trajectory with reward 0.0 whatever the verifier said.
#   "drop":  give up at once: failed result, no retry (deterministic failures).
Action = Literal["retry", "keep", "zero", "drop"]

# How a trial ended; see `arl.harbor.policy.classify` for the mapping from Harbor's exceptions.
FailureKind = Literal[
    "ok",
    "sandbox",
    "model_provider",
    "agent_error",
    "agent_timeout",
    "agent_exit",
    "agent_refused",
    "context_length",
    "output_length",
    "verifier_timeout",
    "verifier_error",
    "verifier_network",
    "verifier_harness",
    "agent_broke_verifier",
    "no_reward",
    "harbor_error",
    "invalid_task",
    "trial_timeout",
]


class FailurePolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The action per failure kind, and how often a retried task may be attempted.

    Defaults follow the reference design: infrastructure failures (sandbox, LLM endpoint, verifier)
    are retried with a new Trial and never trained on; the agent's own outcomes (timeout, crash,
    context overflow) are kept, since the policy produced them.
    """

    # Total attempts (first try included) for kinds whose action is "retry".
    max_attempts: int = 3
    # Seconds to wait before a retry (multiplied by the attempt number).
    retry_backoff_sec: float = 1.0
    # Environment start/build failure or timeout, healthcheck, agent setup timeout, tests upload,
    # verifier-dir download: the sandbox misbehaved.
    sandbox: Action = "retry"
    # The agent's LLM endpoint failed (proxy or engine error, connection refused, 5xx).
    model_provider: Action = "retry"
    # Any other exception raised in the agent phase (a bug or crash in a host-process agent).
    agent_error: Action = "retry"
    # The agent ran past its timeout; Harbor still runs the verifier on what it left.
    agent_timeout: Action = "keep"
    # An installed agent exited non-zero (NonZeroAgentExitCodeError); the verifier still runs.
    agent_exit: Action = "keep"
    # The model refused (safety refusal / content policy).
    agent_refused: Action = "keep"
    # The conversation outgrew the context window; the trajectory is marked finish_reason="length".
    context_length: Action = "zero"
    # A single response hit max_tokens and the agent gave up.
    output_length: Action = "zero"
    # The verifier ran past its timeout.
    verifier_timeout: Action = "retry"
    # The verifier failed: no/empty/unparsable reward file (e.g. a harness that cannot run and says so by
    # writing no reward, as the SWE tasks' tests/test.sh does), an unknown error while verifying.
    verifier_error: Action = "retry"
    # The verifier tried to reach the network (the sandbox recorded its DNS lookups) and the sandbox has
    # none: its reward says nothing about the solution (e.g. a pytest verifier that installs uv/pytest
    # at run time). Deterministic, so dropped rather than retried; give the verifier its tools offline
    # (environment/local_setup.sh, a tools dir) or route its network.
    verifier_network: Action = "drop"
    # The verifier reported reward 0 but its output shows its own harness could not run (`pytest: command
    # not found`, `No module named pytest`): the 0 says nothing about the solution. Deterministic for the
    # task/environment pair, so dropped; fix the task's environment (its image or local_setup.sh).
    verifier_harness: Action = "drop"
    # The verifier could not produce a reward because of the agent's change (a SWE grader that ran its own
    # harness fine before applying the change, then got no report, a crash or a timeout from the tests):
    # the agent's failure, kept with reward 0.0 — never retried or dropped, or breaking the verifier would
    # be the cheapest way to avoid a 0.
    agent_broke_verifier: Action = "zero"
    # The trial ended without an exception but without the configured reward key.
    no_reward: Action = "retry"
    # Harbor refused an operation for good (e.g. unsupported by the environment).
    harbor_error: Action = "drop"
    # `Trial.create` failed (the task directory or the trial config is invalid), or the local sandbox
    # cannot prepare the task as defined (SandboxTaskError: e.g. Dockerfile RUN steps with no local_setup.sh).
    invalid_task: Action = "drop"
    # The whole attempt ran past `HarborConfig.trial_timeout_sec` and was cancelled.
    trial_timeout: Action = "drop"

    def action(self, kind: FailureKind) -> Action:
        """The action for `kind` ("ok" is always kept)."""
        return "keep" if kind == "ok" else getattr(self, kind)


class HarborConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How `HarborAgentLoop` runs one task as one Harbor trial."""

    # Harbor agent name (`harbor.models.agent.name.AgentName`), e.g. "terminus-2", "oracle", "nop".
    agent: str = "terminus-2"
    # Or a custom agent class, "pkg.mod:Class"; takes precedence over `agent`.
    agent_import_path: str | None = None
    # Served model name; the agent sees `hosted_vllm/<model_name>` (sanitised to LiteLLM's rules).
    model_name: str = "policy"
    # Extra agent constructor kwargs, merged over the defaults (api_base, model_info, rollout details).
    agent_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    # Environment variables for the agent process (installed agents).
    agent_env: dict[str, str] = msgspec.field(default_factory=dict)
    # terminus-2's max_turns (None: the agent's own default).
    max_turns: int | None = None
    # Context window and per-response budget the agent is told about (LiteLLM model_info).
    max_input_tokens: int = 32768
    max_output_tokens: int = 4096
    # Environment: an import path ("pkg.mod:Class") or a Harbor type name ("docker", "modal", ...).
    # The default is the local unshare sandbox; set environment_import_path=None and
    # environment_type="docker" on a machine with Docker.
    environment_import_path: str | None = LOCAL_SANDBOX_IMPORT_PATH
    environment_type: str | None = None
    # Passed to the environment's constructor (EnvironmentConfig.kwargs).
    environment_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    environment_env: dict[str, str] = msgspec.field(default_factory=dict)
    delete_environment: bool = True
    override_cpus: float | None = None
    override_memory_mb: int | None = None
    # Where Harbor writes each trial's directory (logs, result.json).
    trials_dir: str = "harbor_trials"
    # Keep trial directories after the result is built (False: delete them, e.g. for long RL runs).
    keep_trial_dirs: bool = True
    # Harbor's timeout multipliers (None: use `timeout_multiplier`).
    timeout_multiplier: float = 1.0
    agent_timeout_multiplier: float | None = None
    verifier_timeout_multiplier: float | None = None
    agent_setup_timeout_multiplier: float | None = None
    environment_build_timeout_multiplier: float | None = None
    # Overrides the task's [agent].timeout_sec when set.
    agent_timeout_sec: float | None = None
    # Hard ceiling on one attempt (environment + agent + verifier + teardown), in seconds. None: derived
    # per task from its task.toml timeouts (`arl.harbor.tasks.task_timeout_sec`: build + agent setup +
    # agent + verifier, times the largest timeout multiplier, plus a teardown allowance).
    trial_timeout_sec: float | None = None
    # Key of `verifier_result.rewards` used as the scalar reward.
    reward_key: str = "reward"
    # Key of `Task.metadata` holding the Harbor task directory.
    task_path_key: str = "harbor_task_path"
    # Fields of `arl.proxy.ProxyConfig` for the per-trial proxy (e.g. {"tool_parser": "hermes"}, or
    # {"host": "0.0.0.0"} when the sandbox runs on another host). `max_context_len` defaults to
    # `max_input_tokens`.
    proxy_options: dict[str, Any] = msgspec.field(default_factory=dict)
    # Tool-call parser of the per-trial proxy (an `arl.proxy` parser name, e.g. "hermes"); None keeps
    # the proxy's default. Shorthand for proxy_options["tool_parser"].
    tool_parser: str | None = None
    # Address the per-trial proxy binds and advertises (e.g. "0.0.0.0" or this host's IP when the
    # sandbox runs elsewhere); None keeps the proxy's default (loopback). Shorthand for
    # proxy_options["host"].
    proxy_host: str | None = None
    # Seconds to wait for the proxy to start or stop.
    proxy_timeout_sec: float = 30.0
    policy: FailurePolicy = msgspec.field(default_factory=FailurePolicy)

    def __post_init__(self) -> None:
        if self.policy.max_attempts < 1:
            raise ValueError("policy.max_attempts must be >= 1")
        if self.trial_timeout_sec is not None and self.trial_timeout_sec <= 0:
            raise ValueError("trial_timeout_sec must be > 0")
        if not self.agent and not self.agent_import_path:
            raise ValueError("set agent or agent_import_path")

    def proxy_settings(self) -> dict[str, Any]:
        """`arl.proxy.ProxyConfig` fields of the per-trial proxy (context budget, parser, host)."""
        options: dict[str, Any] = {"max_context_len": self.max_input_tokens}
        if self.tool_parser is not None:
            options["tool_parser"] = self.tool_parser
        if self.proxy_host is not None:
            options["host"] = self.proxy_host
        return options | self.proxy_options

    def timeout_multiplier_max(self) -> float:
        """The largest of the timeout multipliers (what bounds one attempt's length)."""
        return max(
            m
            for m in (
                self.timeout_multiplier,
                self.agent_timeout_multiplier,
                self.verifier_timeout_multiplier,
                self.agent_setup_timeout_multiplier,
                self.environment_build_timeout_multiplier,
            )
            if m is not None
        )


class AttemptRecord(msgspec.Struct, kw_only=True):
    """One attempt of a task, for logs and metrics: how it ended and what the policy did."""

    attempt: int
    kind: FailureKind
    action: Action
    error: str = ""
    trial_dir: str = ""
