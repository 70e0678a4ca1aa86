"""Normalizing OpenAI chat messages and tools into the canonical dicts that chat templates render.

One canonical form serves two jobs: it is what the template sees (so `content` is always a string and
tool-call arguments are JSON objects, as vLLM hands them to templates), and it is what the proxy compares
against its session snapshot to tell an appended conversation from a rewritten one.
"""

from __future__ import annotations

import json
from typing import Any

from arl.proxy.errors import BadRequestError, InvalidMessagesError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict) or part.get("type", "text") not in _TEXT_PART_TYPES:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidMessagesError(
                    f"{where}.content[{j}]: only text content parts are supported, got {kind!r}",
                    param=f"{where}.content",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidMessagesError(f"{where}.content[{j}].text must be a string", param=where)
            texts.append(text)
        return "\n".join(texts)
    raise InvalidMessagesError(
        f"{where}.content must be a string, a list of text parts or null, got {type(content).__name__}",
        param=f"{where}.content",
    )


def _arguments(value: Any, where: str) -> Any:
    """Tool-call arguments as templates expect them: a JSON object (strings are parsed, as vLLM does)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value  # not JSON: kept verbatim; templates that print strings still render it
    if isinstance(value, dict):
        return value
    raise InvalidMessagesError(f"{where}.function.arguments must be a JSON string or object", param=where)


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise InvalidMessagesError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    calls: list[dict[str, Any]] = []
    for j, call in enumerate(value):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise InvalidMessagesError(f"{w} must be an object", param=w)
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidMessagesError(f"{w}.function.name must be a string", param=w)
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), w)},
        }
        if isinstance(call.get("id"), str):
            out["id"] = call["id"]
        calls.append(out)
    return calls


def normalize_message(msg: Any, index: int) -> dict[str, Any]:
    """One OpenAI message as a canonical dict; raises `InvalidMessagesError` naming what is wrong."""
    where = f"messages[{index}]"
    if not isinstance(msg, dict):
        raise InvalidMessagesError(f"{where} must be an object, got {type(msg).__name__}", param=where)
    role = msg.get("role")
    if not isinstance(role, str):
        raise InvalidMessagesError(f"{where}.role is missing or not a string", param=f"{where}.role")
    if role not in ROLES:
        raise InvalidMessagesError(
            f"{where}.role {role!r} is not one of {sorted(ROLES)}", param=f"{where}.role"
        )
    out: dict[str, Any] = {"role": role, "content": _content_text(msg.get("content"), where)}
    if role == "assistant":
        calls = msg.get("tool_calls")
        if calls:
            out["tool_calls"] = _tool_calls(calls, where)
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str):
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if isinstance(msg.get("tool_call_id"), str):
            out["tool_call_id"] = msg["tool_call_id"]
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    return out


def normalize_messages(messages: Any, start: int = 0) -> list[dict[str, Any]]:
    """Canonical dicts of `messages` (a list), numbering errors from `start`."""
    if not isinstance(messages, list):
        raise InvalidMessagesError("'messages' must be a list of message objects", param="messages")
    return [normalize_message(m, start + i) for i, m in enumerate(messages)]


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Validated OpenAI tool definitions (`[{"type": "function", "function": {"name": ...}}]`), or None."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequestError("'tools' must be a list", param="tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", param=f"tools[{i}]"
            )
    return tools or None
