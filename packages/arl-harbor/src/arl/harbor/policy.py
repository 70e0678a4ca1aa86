"""The failure policy: how a finished (or failed) Harbor trial is classified, and what follows from it.

`classify` maps a `TrialResult` to a `FailureKind` using Harbor's own exception table
(`harbor.models.trial.error_policy`, keyed by exception type name, so stored results classify the same
way) refined by the trial phase the failure happened in; `decide` turns the kind into accept / retry /
fail under a `FailurePolicy`; `reward_for` gives the scalar reward of an accepted trajectory.

| kind             | Harbor exceptions (exception_type)                                    | default |
|------------------|------------------------------------------------------------------------|---------|
| sandbox          | EnvironmentStartTimeoutError, SandboxBuildFailedError, HealthcheckError,| retry   |
|                  | AgentSetupTimeoutError, AddTestsDirError, DownloadVerifierDirError,    |         |
|                  | SandboxError (local sandbox), any unknown error before the agent ran   |         |
| model_provider   | APIConnectionError, InternalServerError, Api*Error, NetworkConnection… | retry   |
| harbor_error     | BadRequestError, AuthenticationError, ModelNotFoundError, Harbor's own | drop    |
|                  | non-retryable errors (ServiceOperationsUnsupportedError, …)            |         |
| agent_error      | any other exception in the agent phase                                 | retry   |
| agent_timeout    | AgentTimeoutError (verifier still runs)                                | keep    |
| agent_exit       | NonZeroAgentExitCodeError (verifier still runs)                        | keep    |
| agent_refused    | AgentSafetyRefusalError, ContentPolicyViolationError                   | keep    |
| context_length   | ContextLengthExceededError, ContextWindowExceededError                 | zero    |
| output_length    | OutputLengthExceededError, OutputTokenExceededError                    | zero    |
| verifier_timeout | VerifierTimeoutError                                                   | retry   |
| verifier_error   | RewardFileNotFoundError, RewardFileEmptyError, VerifierOutputParse…    | retry   |
| verifier_network | the verifier tried to reach the network the local sandbox does not have | drop    |
|                  | (DNS lookups recorded during verification; see `network_attempts`)    |         |
| verifier_harness | reward 0 while the verifier's output shows its harness could not run   | drop    |
|                  | (`pytest: command not found`, `No module named pytest`; `harness_failure`)|       |
| agent_broke_verifier | the verifier reports `agent_broke_verifier` (the agent's change made its | zero |
|                  | tests crash, hang or leave no report after its harness was checked)    |         |
| sandbox          | also: a directory artifact of a separate verifier could not be collected | retry  |
| no_reward        | no exception, but no `reward_key` in verifier_result.rewards           | retry   |
| invalid_task     | `Trial.create` raised (bad task dir or trial config), SandboxTaskError | drop    |
|                  | (the local sandbox cannot prepare the task as defined)                 |         |
| trial_timeout    | the attempt ran past `HarborConfig.trial_timeout_sec`                  | drop    |
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from harbor.models.trial.error_policy import FailureCause, policy_for
from harbor.models.trial.result import TrialResult

from arl.harbor.types import Action, FailureKind, FailurePolicy

__all__ = [
    "AGENT_BROKE_VERIFIER",
    "Decision",
    "FailurePolicy",
    "artifact_failures",
    "broken_verifier_cause",
    "classify",
    "classify_exception",
    "decide",
    "grades_own_harness",
    "harness_failure",
    "network_attempts",
    "phase_of",
    "reward_for",
    "tells",
    "verifier_output",
]

Phase = Literal["environment", "agent_setup", "agent", "verifier"]
Decision = Literal["accept", "retry", "fail"]

# Checked before Harbor's table: finer kinds than its FailureCause, and arl's own errors.
_BY_NAME: dict[str, FailureKind] = {
    "AgentTimeoutError": "agent_timeout",
    "ContextLengthExceededError": "context_length",
    "ContextWindowExceededError": "context_length",
    "OutputLengthExceededError": "output_length",
    "OutputTokenExceededError": "output_length",
    "AgentSafetyRefusalError": "agent_refused",
    "ContentPolicyViolationError": "agent_refused",
    "VerifierTimeoutError": "verifier_timeout",
    "RewardFileNotFoundError": "verifier_error",
    "RewardFileEmptyError": "verifier_error",
    "VerifierOutputParseError": "verifier_error",
    "NonZeroAgentExitCodeError": "agent_exit",
    "SandboxError": "sandbox",
    "SandboxTaskError": "invalid_task",
    "DockerBuildError": "sandbox",
    # dockerd failed an exec or copy of a running trial (e.g. its container was killed): infrastructure.
    "DockerEngineError": "sandbox",
    "SandboxStartError": "sandbox",
    "SandboxExecTimeoutError": "sandbox",
    "CancelledError": "trial_timeout",
}


def phase_of(result: TrialResult) -> Phase:
    """The last phase the trial entered, from its timings."""
    if result.verifier is not None:
        return "verifier"
    if result.agent_execution is not None:
        return "agent"
    if result.agent_setup is not None:
        return "agent_setup"
    return "environment"


def classify_exception(exception_type: str, phase: Phase) -> FailureKind:
    """The failure kind of an exception (by type name) raised in `phase`."""
    if exception_type in _BY_NAME:
        return _BY_NAME[exception_type]
    harbor = policy_for(exception_type)
    match harbor.cause:
        case FailureCause.SANDBOX_FAILED:
            return "sandbox"
        case FailureCause.MODEL_PROVIDER_FAILED:
            return "model_provider" if harbor.retry else "harbor_error"
        case FailureCause.HARBOR_FAILED:
            return "harbor_error"
        case FailureCause.AGENT_EXHAUSTED_BUDGET:
            return "agent_timeout"
        case FailureCause.AGENT_REFUSED_TASK:
            return "agent_refused"
        case FailureCause.VERIFIER_FAILED:
            return "verifier_error"
        case FailureCause.CANCELLED:
            return "trial_timeout"
    # Unclassified: decide by where it happened.
    if phase in ("environment", "agent_setup"):
        return "sandbox"
    return "agent_error" if phase == "agent" else "verifier_error"


def classify(result: TrialResult, reward_key: str = "reward") -> FailureKind:
    """How a trial ended: "ok" when it raised nothing and the verifier reported `reward_key`."""
    if result.exception_info is not None:
        return classify_exception(result.exception_info.exception_type, phase_of(result))
    rewards = result.verifier_result.rewards if result.verifier_result is not None else None
    if not rewards or reward_key not in rewards:
        return "no_reward"
    return "ok"


def network_attempts(trial_dir: Path, result: TrialResult) -> list[str]:
    """Names the verifier tried to resolve during this trial's verification (local sandbox only).

    The local sandbox's DNS recorder appends every lookup to `<trial_dir>/arl_sandbox_network.jsonl`;
    those that fall within the verifier's timing window are the verifier's (a separate verifier's
    environment writes to the same file).
    """
    log = trial_dir / "arl_sandbox_network.jsonl"
    timing = result.verifier
    if timing is None or timing.started_at is None or not log.is_file():
        return []
    start = timing.started_at.timestamp()
    end = timing.finished_at.timestamp() if timing.finished_at is not None else float("inf")
    names = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if start <= float(record.get("t", 0.0)) <= end + 1.0:
            names.append(str(record.get("name", "")))
    return list(dict.fromkeys(names))


# A verifier's own tools missing or not importable: its exit says nothing about the solution. Narrow on
# purpose: "No module named 'mypkg'" (the agent broke the package) is a legitimate 0 and does not match.
_HARNESS_FAILURES = re.compile(
    r"(?m)(?:^|[\s:])(?P<tool>pytest|py\.test|python3?(?:\.\d+)?|pip3?|uvx?|tox|nox|node|npm|npx|go|cargo|java|mvn)"
    r": (?:command )?not found"
    r"|No module named '?(?P<module>pytest|_pytest|pluggy|pytest_[A-Za-z0-9_]+)'?"
    r"|(?P<cannot>arl-swe verifier cannot run: .*)"
)
_VERIFIER_OUTPUT_LIMIT = 64 * 1024


def verifier_output(trial_dir: Path) -> str:
    """The verifier's combined stdout/stderr of this trial (Harbor's `verifier/test-stdout.txt`), tail."""
    path = trial_dir / "verifier" / "test-stdout.txt"
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - _VERIFIER_OUTPUT_LIMIT))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def harness_failure(output: str) -> str | None:
    """The line of a verifier's output that shows its harness could not run, if any."""
    match = _HARNESS_FAILURES.search(output)
    if match is None:
        return None
    start = output.rfind("\n", 0, match.start()) + 1
    end = output.find("\n", match.end())
    return output[start : end if end >= 0 else len(output)].strip()[:300]


# The reward key a verifier sets when the agent's change broke it (and the line it prints why).
AGENT_BROKE_VERIFIER = "agent_broke_verifier"
_BROKE_LINE = re.compile(r"the agent's change broke the verifier: (?P<cause>.*)")
# Reward keys that are signs of reward hacking (counted per trial), besides the agent's leftover processes.
_TELL_KEYS = ("protected_touched", "change_refused", AGENT_BROKE_VERIFIER, "runner_tampered")


def grades_own_harness(rewards: dict[str, float] | None) -> bool:
    """Whether the verifier is a grader that checks its own harness before the agent's change can matter
    (arl's SWE grader, which reports `protected_touched`): its 0 is never a harness failure, and its output
    (which shows names the agent chose) is not searched for one."""
    return bool(rewards) and "protected_touched" in rewards


def broken_verifier_cause(trial_dir: Path) -> str:
    """Why the agent's change broke the verifier, from its output ("" when it did not say)."""
    match = _BROKE_LINE.search(verifier_output(trial_dir))
    return match.group("cause").strip()[:300] if match else ""


def artifact_failures(trial_dir: Path) -> list[str]:
    """Directory artifacts Harbor could not collect from the agent's environment (`artifacts/manifest.json`).

    arl's environments carry a directory the agent removed or replaced by a link as an empty directory,
    so a directory that failed is the infrastructure's: the verifier would grade an environment without
    the agent's change. A file artifact that failed is usually one the agent did not write: its verifier
    scores that.
    """
    path = trial_dir / "artifacts" / "manifest.json"
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if isinstance(entries, dict):
        entries = entries.get("entries") or entries.get("artifacts") or []
    return [
        str(e.get("source"))
        for e in entries
        if isinstance(e, dict) and e.get("status") == "failed" and e.get("type") == "directory"
    ]


def tells(result: TrialResult | None, trial_dir: Path) -> dict[str, float]:
    """The signs of reward hacking in a trial: the grader's keys of reward.json, the leftover processes."""
    from arl.harbor.agent_end import read_leftover_processes

    found: dict[str, float] = {}
    rewards = (result.verifier_result.rewards or {}) if result is not None and result.verifier_result else {}
    for key in _TELL_KEYS:
        value = rewards.get(key)
        if isinstance(value, int | float) and value > 0:
            found[key] = float(value)
    left = read_leftover_processes(trial_dir)
    if left:
        found["leftover_processes"] = float(left)
    return found


def decide(policy: FailurePolicy, kind: FailureKind, attempt: int) -> tuple[Decision, Action]:
    """What to do after attempt number `attempt` (1-based) ended as `kind`."""
    action = policy.action(kind)
    if action == "retry":
        return ("retry" if attempt < policy.max_attempts else "fail"), action
    if action == "drop":
        return "fail", action
    return "accept", action


def reward_for(action: Action, result: TrialResult | None, reward_key: str = "reward") -> float:
    """The scalar reward of an accepted trajectory: the verifier's for "keep" (0.0 if it did not run)."""
    if action == "zero" or result is None or result.verifier_result is None:
        return 0.0
    rewards = result.verifier_result.rewards or {}
    value = rewards.get(reward_key, 0.0)
    return float(value) if isinstance(value, int | float) else 0.0
