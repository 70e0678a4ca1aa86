"""The tool-calling agent loop: a multi-turn conversation through arl-proxy, tools run in-process.

The loop is an OpenAI-style agent: it posts the chat to its own `ChatProxy` session (so the
trajectory is recorded token-exactly, with tool output at mask 0), runs every tool call the model
makes, appends the results and asks again, until the model answers without a tool call, the turn
budget is spent, or a turn is cut by length. The final answer is scored with the task's reward.

One proxy serves every trajectory of the loop; its generator is the server manager the rollouter
passes in, so turns are load-balanced, sticky per trajectory and survive weight syncs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from arl.proxy import ChatProxy, ProxyConfig
from arl.proxy.generator import Generator
from arl.proxy.types import SamplingParams
from arl.rollout.agent_loop import register_agent_loop
from arl.rollout.errors import RolloutError
from arl.rollout.rewards import get_reward
from arl.rollout.tools import BUILTIN_TOOLS, Tool
from arl.rollout.trajectories import result_from_trajectory
from arl.rollout.types import AgentResult, Task


class ToolAgentLoop:
    def __init__(
        self,
        tokenizer: Any,
        *,
        tools: Mapping[str, Tool] = BUILTIN_TOOLS,
        max_turns: int = 6,
        tool_parser: str = "hermes",
        request_timeout_s: float = 600.0,
        proxy_config: ProxyConfig | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = dict(tools)
        self.max_turns = max_turns
        self.request_timeout_s = request_timeout_s
        self._proxy_config = proxy_config or ProxyConfig(tool_parser=tool_parser)
        self._proxy: ChatProxy | None = None
        self._generator: Generator | None = None
        self._start_lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None

    async def _ensure_started(self, generator: Generator) -> ChatProxy:
        async with self._start_lock:
            if self._proxy is None:
                self._proxy = ChatProxy(self.tokenizer, generator, self._proxy_config)
                await self._proxy.start()
                self._generator = generator
                self._http = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)
                )
            elif generator is not self._generator:
                raise RolloutError("a ToolAgentLoop serves one generator; make one loop per server manager")
        return self._proxy

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._proxy is not None:
            await self._proxy.stop()

    def _task_tools(self, task: Task) -> list[Tool]:
        names = task.metadata.get("tools", sorted(self.tools))
        unknown = [n for n in names if n not in self.tools]
        if unknown:
            raise RolloutError(
                f"task {task.id} asks for unknown tools {unknown}; available: {sorted(self.tools)}"
            )
        return [self.tools[n] for n in names]

    async def run(
        self, task: Task, generator: Generator, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult:
        proxy = await self._ensure_started(generator)
        assert self._http is not None
        tools = self._task_tools(task)
        session = proxy.open_session()
        messages: list[dict[str, Any]] = [dict(m) for m in task.messages]
        answer, finish_reason, started = "", "stop", time.perf_counter()
        try:
            for _turn in range(self.max_turns):
                reply = await self._complete(session.base_url, messages, tools, sampling_params)
                choice = reply["choices"][0]
                message = choice["message"]
                finish_reason = choice["finish_reason"]
                messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                calls = message.get("tool_calls") or []
                if not calls or finish_reason == "length":
                    answer = message.get("content") or ""
                    break
                for call in calls:
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": await self._call_tool(call)}
                    )
        finally:
            trajectory = proxy.pop_session(session.id)
            forget = getattr(generator, "forget", None)
            if forget is not None:
                forget(session.id)  # the proxy's request id for this trajectory is its session id
        reward = get_reward(task.reward_fn)(answer, task.ground_truth)
        # Every segment travels (a template that rewrites earlier turns starts a new one), so every
        # sampled token is trained once.
        return result_from_trajectory(
            trajectory,
            reward=reward,
            finish_reason=finish_reason,
            timings={"episode": time.perf_counter() - started},
        )

    async def _complete(
        self, base_url: str, messages: list[dict[str, Any]], tools: list[Tool], params: SamplingParams
    ) -> dict[str, Any]:
        assert self._http is not None
        body = {
            "model": self._proxy_config.model_name,
            "messages": messages,
            "tools": [t.schema() for t in tools],
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        async with self._http.post(f"{base_url}/chat/completions", json=body) as response:
            payload = await response.json()
            if response.status != 200:
                raise RolloutError(f"the proxy answered {response.status}: {payload.get('error', payload)}")
            return payload

    async def _call_tool(self, call: dict[str, Any]) -> str:
        name = call["function"]["name"]
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}"
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
            result = tool.fn(**arguments)
            if inspect.isawaitable(result):
                result = await result
            return str(result)
        except Exception as exc:  # the model sees the failure, as from a real environment
            return f"error: {type(exc).__name__}: {exc}"


register_agent_loop("tool_loop", ToolAgentLoop)
