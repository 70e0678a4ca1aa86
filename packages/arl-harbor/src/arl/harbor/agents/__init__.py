"""SWE agents run through arl-proxy: arl's shell agent, Harbor's terminus-2 and mini-swe-agent.

- `arl.harbor.agents.mini_swe.MiniSweAgent`: Harbor's mini-swe-agent adapter using a copy installed
  ahead of time (no network at setup) and reaching the proxy from inside the sandbox through a unix
  socket bridge (`arl.harbor.agents.bridge`).
- `arl.harbor.agents.install`: the offline wheelhouse, the host venv for the local sandbox, and the
  Dockerfile lines that install mini-swe-agent into a task image.
- `arl.harbor.agents.scripts`: scripted policies (oracle / nop / edit-tests) in each agent's syntax.
- `agent_settings(name)`: the `HarborConfig` fields that select an agent by its short name.
"""

from __future__ import annotations

from typing import Any

SHELL_AGENT_IMPORT_PATH = "arl.harbor.shell_agent:ShellAgent"
MINI_SWE_AGENT_IMPORT_PATH = "arl.harbor.agents.mini_swe:MiniSweAgent"


def agent_settings(agent: str) -> dict[str, Any]:
    """`HarborConfig` fields for "shell", "terminus-2" or "mini-swe-agent" (all with hermes tool calls
    parsed by the proxy where the agent uses tools)."""
    if agent == "shell":
        return {"agent_import_path": SHELL_AGENT_IMPORT_PATH, "tool_parser": "hermes"}
    if agent == "terminus-2":
        return {"agent": "terminus-2"}
    if agent == "mini-swe-agent":
        return {"agent_import_path": MINI_SWE_AGENT_IMPORT_PATH, "tool_parser": "hermes"}
    raise ValueError(f"unknown agent {agent!r}; choose one of shell, terminus-2, mini-swe-agent")
