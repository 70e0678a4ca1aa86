"""Errors raised by arl-harbor. All derive from `HarborError`.

Failures *inside* a Harbor trial (sandbox, agent, verifier) are not raised to the caller: the failure
policy (`arl.harbor.policy`) turns them into a retry or an `AgentResult(failed=True, error=...)`. These
errors are for misuse of the package and for the local sandbox's own failures, which Harbor records in
`TrialResult.exception_info` like any environment error.
"""


class HarborError(Exception):
    """Base of every error arl-harbor raises."""


class HarborConfigError(HarborError, ValueError):
    """A `HarborConfig` (or a task's metadata) is invalid, e.g. no `harbor_task_path` in the task."""


class SandboxError(HarborError, RuntimeError):
    """The local sandbox environment failed (namespace setup, exec plumbing, file transfer)."""


class SandboxStartError(SandboxError):
    """The local sandbox could not start: `unshare` unavailable, not root, or the setup script failed."""


class SandboxExecTimeoutError(SandboxError):
    """A command in the local sandbox ran past its `timeout_sec` and was killed (Docker raises likewise)."""


class SandboxTaskError(SandboxError):
    """The task cannot run in the local sandbox as it is defined (deterministic: dropped, never retried).

    E.g. its Dockerfile has RUN steps the sandbox does not execute and no `local_setup.sh` stands in
    for them, or a path of its `local_binds.json` does not exist.
    """


class PackageRefusedError(HarborError):
    """The SWE builder refused a package, for a measured reason: its sdist could not be fetched, its test deps
    not installed, its suite collected no tests or did not collect, ran past the time limit, or none of its
    tests passed on the pristine source. `kind` is one word for the summary; the message says what was seen."""

    def __init__(self, package: str, kind: str, reason: str) -> None:
        super().__init__(f"{package} refused ({kind}): {reason}")
        self.package, self.kind, self.reason = package, kind, reason
