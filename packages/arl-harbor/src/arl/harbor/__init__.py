"""arl-harbor: Harbor trials as arl agent loops.

`HarborAgentLoop` (registered as agent loop "harbor") runs one task as one Harbor trial whose agent
talks to the arl proxy, applies the failure policy (`FailurePolicy`, `arl.harbor.policy`) and returns
an `AgentResult`; `LocalSandboxEnvironment` runs trials without Docker (isolation, not security).
"""

from arl.harbor.environment import LocalSandboxEnvironment
from arl.harbor.errors import (
    HarborConfigError,
    HarborError,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxStartError,
)
from arl.harbor.policy import classify, classify_exception, decide, reward_for
from arl.harbor.trial_loop import HarborAgentLoop, litellm_model_name, make_harbor_agent_loop, trial_timings
from arl.harbor.types import (
    LOCAL_SANDBOX_IMPORT_PATH,
    Action,
    AttemptRecord,
    FailureKind,
    FailurePolicy,
    HarborConfig,
)

__all__ = [
    "LOCAL_SANDBOX_IMPORT_PATH",
    "Action",
    "AttemptRecord",
    "FailureKind",
    "FailurePolicy",
    "HarborAgentLoop",
    "HarborConfig",
    "HarborConfigError",
    "HarborError",
    "LocalSandboxEnvironment",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxStartError",
    "classify",
    "classify_exception",
    "decide",
    "litellm_model_name",
    "make_harbor_agent_loop",
    "reward_for",
    "trial_timings",
]
