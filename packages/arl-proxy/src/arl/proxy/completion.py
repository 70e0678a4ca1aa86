"""Turning one `TokenOutput` into an assistant reply: stop strings, content text, tool calls, finish reason.

It also decides which sampled tokens enter the trajectory: all of them, except that a completion stopped
by a stop *string* keeps only the tokens before it (the agent never sees the stop string, so the next
turn's prompt does not contain it either), and whether the engine stopped on the template's end-of-turn
token (then the tail after it is backfilled with mask 0).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arl.proxy.chat import ChatCodec
from arl.proxy.tool_parsers import ParsedOutput, ToolCall
from arl.proxy.trajectory import SampledTurn
from arl.proxy.types import TokenOutput


@dataclass(slots=True)
class Reply:
    """An assistant reply, in OpenAI shape and in the canonical shape the template renders."""

    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    turn: SampledTurn
    token_ids: list[int]  # everything the engine sampled (what `return_token_ids` reports)
    log_probs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None

    def openai_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg

    def canonical_message(self) -> dict[str, Any]:
        """The reply as `messages.normalize_message` would normalize the agent's echo of it."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            calls = []
            for c in self.tool_calls:
                try:
                    args: Any = json.loads(c.arguments)
                except ValueError:
                    args = c.arguments
                calls.append(
                    {"type": "function", "function": {"name": c.name, "arguments": args}, "id": c.id}
                )
            msg["tool_calls"] = calls
        return msg


def _trim_to_text(codec: ChatCodec, ids: list[int], text: str) -> list[int]:
    """The longest prefix of `ids` whose text is a prefix of `text` (stop strings end within a few tokens)."""
    j = len(ids)
    while j > 0 and not text.startswith(codec.decode(ids[:j], skip_special_tokens=True)):
        j -= 1
    return ids[:j]


def build_reply(
    codec: ChatCodec,
    out: TokenOutput,
    stop: list[str],
    parser: Callable[[str, list[dict[str, Any]] | None], ParsedOutput] | None,
    tools: list[dict[str, Any]] | None,
) -> Reply:
    """Interpret one generation: OpenAI content/tool calls and the tokens that enter the trajectory."""
    ids = list(out.token_ids)
    lps = list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids)
    stopped_on_token = bool(ids) and out.stop_reason == "stop" and ids[-1] in codec.stop_token_ids
    body = ids[:-1] if stopped_on_token else ids
    text = codec.decode(body, skip_special_tokens=True)
    kept = len(ids)
    if stop and out.stop_reason == "stop" and not stopped_on_token:
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        if hits:
            text = text[: min(hits)]
            kept = len(_trim_to_text(codec, body, text))
    parsed = parser(text, tools) if parser is not None else ParsedOutput(text or None, [])
    if out.stop_reason == "abort":
        finish = "abort"
    elif parsed.tool_calls:
        finish = "tool_calls"
    else:
        finish = out.stop_reason
    turn = SampledTurn(
        ids=ids[:kept],
        logprobs=lps[:kept],
        ended_on_eot=stopped_on_token and kept == len(ids) and ids[-1] == codec.eot_id,
        versions=list(out.weight_versions[:kept]) if out.weight_versions is not None else None,
        experts=list(out.routed_experts[:kept]) if out.routed_experts is not None else None,
    )
    return Reply(parsed.content, parsed.tool_calls, finish, turn, ids, lps, out.top_logprobs)
