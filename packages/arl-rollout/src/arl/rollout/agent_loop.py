"""The agent-loop seam: how one task becomes one trajectory.

An agent loop receives a `Task`, a `Generator` (the server manager, which load-balances over engine
replicas and survives weight syncs) and sampling settings, and returns an `AgentResult`. Loops are
registered by name so that a dataset row's `agent` field picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from arl.proxy.generator import Generator
from arl.proxy.types import SamplingParams
from arl.rollout.errors import UnknownAgentLoopError
from arl.rollout.types import AgentResult, Task


class AgentLoop(Protocol):
    """Runs one task to completion. `request_id` is unique per trajectory and stable across its turns."""

    async def run(
        self, task: Task, generator: Generator, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult: ...


AgentLoopFactory = Callable[..., AgentLoop]
_REGISTRY: dict[str, AgentLoopFactory] = {}


def register_agent_loop(name: str, factory: AgentLoopFactory) -> None:
    """Make `factory(**options)` available as the agent loop called `name`."""
    _REGISTRY[name] = factory


def make_agent_loop(name: str, **options: Any) -> AgentLoop:
    """Build the agent loop registered as `name`."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownAgentLoopError(f"unknown agent loop {name!r}; registered: {sorted(_REGISTRY)}") from None
    return factory(**options)
