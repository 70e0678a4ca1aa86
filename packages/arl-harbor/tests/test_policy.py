"""The failure policy's classification and decisions, on Harbor's real exception names and results."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from harbor.models.trial.result import ExceptionInfo, TimingInfo

from arl.harbor import FailurePolicy, HarborConfig, classify_exception, decide
from arl.harbor.policy import phase_of


@pytest.mark.parametrize(
    ("name", "phase", "kind"),
    [
        ("EnvironmentStartTimeoutError", "environment", "sandbox"),
        ("SandboxBuildFailedError", "environment", "sandbox"),
        ("SandboxStartError", "environment", "sandbox"),
        ("AgentSetupTimeoutError", "agent_setup", "sandbox"),
        ("RuntimeError", "environment", "sandbox"),  # unknown, before the agent ran
        ("RuntimeError", "agent", "agent_error"),
        ("RuntimeError", "verifier", "verifier_error"),
        ("AgentTimeoutError", "agent", "agent_timeout"),
        ("NonZeroAgentExitCodeError", "agent", "agent_exit"),
        ("ContextLengthExceededError", "agent", "context_length"),
        ("ContextWindowExceededError", "agent", "context_length"),
        ("OutputLengthExceededError", "agent", "output_length"),
        ("APIConnectionError", "agent", "model_provider"),
        ("InternalServerError", "agent", "model_provider"),
        ("BadRequestError", "agent", "harbor_error"),
        ("ModelNotFoundError", "agent", "harbor_error"),
        ("AgentSafetyRefusalError", "agent", "agent_refused"),
        ("VerifierTimeoutError", "verifier", "verifier_timeout"),
        ("RewardFileNotFoundError", "verifier", "verifier_error"),
        ("AddTestsDirError", "verifier", "sandbox"),
        ("CancelledError", "agent", "trial_timeout"),
        ("SandboxTaskError", "verifier", "invalid_task"),  # the local sandbox cannot prepare the task
        ("DockerBuildError", "environment", "sandbox"),
        ("DockerEngineError", "verifier", "sandbox"),  # dockerd failed an exec of a running trial
    ],
)
def test_classify_exception(name, phase, kind):
    assert classify_exception(name, phase) == kind


def test_phase_from_timings():
    from harbor.models.trial.result import TrialResult

    fields = TrialResult.model_fields
    assert {"environment_setup", "agent_setup", "agent_execution", "verifier"} <= set(fields)
    now = datetime.now(UTC)
    t = TimingInfo(started_at=now, finished_at=now)

    class R:  # only the timing attributes phase_of reads
        environment_setup = t
        agent_setup = None
        agent_execution = None
        verifier = None
        exception_info = ExceptionInfo.from_exception(RuntimeError("x"))

    assert phase_of(R()) == "environment"  # type: ignore[arg-type]
    R.agent_setup = t
    assert phase_of(R()) == "agent_setup"  # type: ignore[arg-type]
    R.agent_execution = t
    assert phase_of(R()) == "agent"  # type: ignore[arg-type]


def test_decide_retries_until_attempts_run_out():
    policy = FailurePolicy(max_attempts=3)
    assert decide(policy, "sandbox", 1) == ("retry", "retry")
    assert decide(policy, "sandbox", 3) == ("fail", "retry")
    assert decide(policy, "invalid_task", 1) == ("fail", "drop")
    assert decide(policy, "agent_timeout", 1) == ("accept", "keep")
    assert decide(policy, "context_length", 1) == ("accept", "zero")
    assert decide(policy, "ok", 1) == ("accept", "keep")


def test_config_loads_from_toml_and_rejects_unknown_fields():
    text = b"""
agent = "terminus-2"
model_name = "Qwen/Qwen3-8B"
[policy]
max_attempts = 5
agent_timeout = "zero"
"""
    config = msgspec.toml.decode(text, type=HarborConfig)
    assert config.policy.max_attempts == 5 and config.policy.agent_timeout == "zero"
    with pytest.raises(msgspec.ValidationError):
        msgspec.toml.decode(b'[policy]\nsandbox = "maybe"\n', type=HarborConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"agentt": "x"}, HarborConfig)


@pytest.mark.parametrize(
    ("output", "found"),
    [
        ("/tests/test.sh: line 3: pytest: command not found", True),
        ("sh: 1: pytest: not found", True),
        ("/usr/bin/python3: No module named pytest", True),
        ("E   ModuleNotFoundError: No module named 'pytest_timeout'", True),
        ("arl-swe verifier cannot run: pytest is not importable by python3", True),
        # The agent broke the package under test: a legitimate 0, not a harness failure.
        ("E   ModuleNotFoundError: No module named 'minicalc'", False),
        ("FAILED tests/test_calc.py::test_add - assert -1 == 5", False),
    ],
)
def test_harness_failure_is_narrow(output, found):
    from arl.harbor.policy import harness_failure

    assert (harness_failure("collected 2 items\n" + output + "\n") is not None) == found


def test_a_harness_that_cannot_run_is_dropped_not_trained():
    assert decide(FailurePolicy(), "verifier_harness", 1) == ("fail", "drop")
    assert decide(FailurePolicy(), "verifier_error", 1) == ("retry", "retry")
