"""A minimal arl shell agent for Harbor: the model gets one `bash` tool (hermes tool calls through
arl-proxy) and its commands run in the trial's sandbox until it answers without a tool call.

Select it with `HarborConfig(agent_import_path=SHELL_AGENT_IMPORT_PATH, proxy_options={"tool_parser":
"hermes"})`; Harbor hands it the proxy session's URL as `base_url`. It runs in the host process (like
terminus-2) and talks plain OpenAI chat completions, so every turn is recorded token-exactly by the proxy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import aiohttp
from harbor.agents.agent_auth_resolution import ModelConnectionSpec
from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

SHELL_AGENT_IMPORT_PATH = "arl.harbor.shell_agent:ShellAgent"
SYSTEM_PROMPT = (
    "You are a shell agent working in a Linux sandbox. Use the bash tool to run commands. "
    "When the task is done, answer briefly without calling a tool."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the sandbox; returns its output and exit code.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def write_agent_log(path: Path, text: str) -> None:
    """Write `text` to `path` in a log folder the sandbox shares (its /logs/agent), from this host process.

    The agent can put anything there, a link to a host file included: the text goes to a new file of a
    name of our own (created exclusively, links not followed) that then replaces whatever `path` is, so
    the host never writes through something the agent made.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:  # e.g. the agent made `path` a directory: the log is lost, not the trial
        logging.getLogger(__name__).warning("cannot write the agent log %s: %s", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()


class ShellAgent(BaseAgent):
    """Tool-calling loop over one `bash` tool; see the module docstring."""

    # Accept Harbor's base_url (the proxy session's OpenAI endpoint).
    MODEL_CONNECTION = ModelConnectionSpec()
    capabilities = AgentCapabilities(base_url=True)

    def __init__(
        self,
        *args: Any,
        max_turns: int = 8,
        command_timeout_sec: float = 30.0,
        request_timeout_sec: float = 600.0,
        max_output_chars: int = 2000,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_turns = max_turns
        self.command_timeout_sec = command_timeout_sec
        self.request_timeout_sec = request_timeout_sec
        self.max_output_chars = max_output_chars

    @staticmethod
    def name() -> str:
        return "arl-shell"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        if not self._base_url:
            raise ValueError("arl-shell needs base_url (the proxy session's OpenAI endpoint)")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": instruction.strip()},
        ]
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_sec)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for _ in range(self.max_turns):
                body = {"model": self.model_name or "policy", "messages": messages, "tools": [BASH_TOOL]}
                async with http.post(f"{self._base_url.rstrip('/')}/chat/completions", json=body) as response:
                    payload = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"the model endpoint answered {response.status}: {payload}")
                choice = payload["choices"][0]
                message = choice["message"]
                messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                calls = message.get("tool_calls") or []
                if not calls or choice.get("finish_reason") == "length":
                    break
                for call in calls:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call["id"],
                            "content": await self._bash(call, environment),
                        }
                    )
        write_agent_log(self.logs_dir / "arl_shell_messages.json", json.dumps(messages, indent=1))

    async def _bash(self, call: dict[str, Any], environment: BaseEnvironment) -> str:
        try:
            args = json.loads(call["function"].get("arguments") or "{}")
            command = args["command"] if call["function"]["name"] == "bash" else None
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            return f"error: bad tool call: {exc}"
        if not isinstance(command, str):
            return f"error: unknown tool {call['function']['name']!r}; use bash"
        try:
            result = await environment.exec(command, timeout_sec=self.command_timeout_sec)
        except Exception as exc:  # a timeout or sandbox error is what the model sees, as from a terminal
            return f"error: {type(exc).__name__}: {exc}"
        out = (result.stdout or "") + (result.stderr or "")
        return f"{out[-self.max_output_chars :]}\n[exit code {result.return_code}]"
