"""arl-harbor: Harbor trials as arl agent loops.

`HarborAgentLoop` (registered as agent loop "harbor" when `arl.harbor.trial_loop` is imported) runs one
task as one Harbor trial whose agent talks to the arl proxy, applies the failure policy
(`FailurePolicy`, `arl.harbor.policy`) and returns an `AgentResult`; `LocalSandboxEnvironment` runs
trials without Docker; `arl.harbor.tasks` reads task sets. Names are loaded lazily so that the light
modules (`types`, `tasks`, `errors`) import without Harbor itself (the app's config does).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LocalSandboxEnvironment": "environment",
    "SandboxLimits": "sandbox_limits",
    "HarborConfigError": "errors",
    "HarborError": "errors",
    "SandboxError": "errors",
    "SandboxExecTimeoutError": "errors",
    "SandboxStartError": "errors",
    "classify": "policy",
    "classify_exception": "policy",
    "decide": "policy",
    "reward_for": "policy",
    "HarborAgentLoop": "trial_loop",
    "litellm_model_name": "trial_loop",
    "make_harbor_agent_loop": "trial_loop",
    "trial_timings": "trial_loop",
    "check_harbor_config": "trial_loop",
    "load_harbor_tasks": "tasks",
    "validate_task": "tasks",
    "LOCAL_SANDBOX_IMPORT_PATH": "types",
    "Action": "types",
    "AttemptRecord": "types",
    "FailureKind": "types",
    "FailurePolicy": "types",
    "HarborConfig": "types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'arl.harbor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"arl.harbor.{module}"), name)
    globals()[name] = value
    return value
