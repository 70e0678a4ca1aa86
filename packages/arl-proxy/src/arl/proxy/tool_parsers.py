"""Tool-call parsers that turn a completion's text into OpenAI `tool_calls`, behaving like vLLM's.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/Qwen3, Hermes).
- `qwen3_coder`: `<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`, values
  converted by the tool's JSON schema.
- `llama3_json`: a bare `{"name": ..., "parameters": {...}}` object (several separated by `;`).

Shared behaviour: text before the first call is the content (one newline before the call is the
template's separator and is dropped, so the template renders the turn back to the same text); an unclosed
last call is parsed; a call that fails to parse returns the whole output as content with no calls; calls
inside a `<think>...</think>` block are reasoning, not calls (they stay in the content).
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arl.proxy.errors import ToolParserError


@dataclass(slots=True)
class ToolCall:
    """One parsed call: `arguments` is a JSON string, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class ParsedOutput:
    """Content (None when empty) and tool calls of one completion."""

    content: str | None
    tool_calls: list[ToolCall]


def _split_reasoning(text: str) -> tuple[int, bool]:
    """Offset where tool calls may start (after `</think>`), and whether a think block is left open."""
    end = text.rfind("</think>")
    if end >= 0:
        return end + len("</think>"), False
    if "<think>" in text:
        return len(text), True
    return 0, False


def _content_before(text: str, at: int) -> str | None:
    content = text[:at]
    if content.endswith("\n"):
        content = content[:-1]
    return content or None


_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parse_hermes(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """vLLM's `hermes` parser."""
    start, _open = _split_reasoning(text)
    first = text.find("<tool_call>", start)
    if first < 0:
        return ParsedOutput(text or None, [])
    calls: list[ToolCall] = []
    try:
        for m in _HERMES_RE.finditer(text, first):
            body = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
            obj = json.loads(body)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("a tool call needs a string 'name'")
            args = obj.get("arguments", obj.get("parameters", {}))
            calls.append(ToolCall(obj["name"], json.dumps(args, ensure_ascii=False)))
    except ValueError:
        return ParsedOutput(text or None, [])
    return ParsedOutput(_content_before(text, first), calls)


_CODER_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*?)$", re.DOTALL)
_CODER_FUNC_RE = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_CODER_PARAM_RE = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)


def _schema_type(tools: list[dict[str, Any]] | None, fn: str, param: str) -> str | None:
    for tool in tools or []:
        f = tool.get("function", {})
        if f.get("name") == fn:
            props = (f.get("parameters") or {}).get("properties") or {}
            spec = props.get(param)
            if not isinstance(spec, dict):
                return None
            t = spec.get("type", "string")
            if isinstance(t, list):
                t = next((x for x in t if x != "null"), "string")
            return str(t).lower()
    return None


def _convert(value: str, typ: str | None) -> Any:
    """A qwen3_coder parameter value converted by its JSON-schema type (as vLLM's parser does)."""
    if typ is None:
        return value
    if value.lower() == "null":
        return None
    if typ in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    if typ.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value)
        except ValueError:
            return value
    if typ.startswith(("num", "float", "double")):
        try:
            f = float(value)
        except ValueError:
            return value
        return int(f) if f.is_integer() and "." not in value and "e" not in value.lower() else f
    if typ in ("boolean", "bool", "binary"):
        return value.strip().lower() == "true"
    if typ in ("object", "array", "dict", "list") or typ.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except ValueError:
            try:
                return ast.literal_eval(value)
            except (ValueError, SyntaxError):
                return value
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_qwen3_coder(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """vLLM's `qwen3_coder` parser (XML-style function calls)."""
    start, _open = _split_reasoning(text)
    first = text.find("<tool_call>", start)
    if first < 0:
        return ParsedOutput(text or None, [])
    calls: list[ToolCall] = []
    for m in _CODER_CALL_RE.finditer(text, first):
        block = m.group(1) if m.group(1) is not None else m.group(2)
        for fm in _CODER_FUNC_RE.finditer(block):
            func = fm.group(1) if fm.group(1) is not None else fm.group(2)
            name, sep, body = func.partition(">")
            name = name.strip()
            if not sep or not name:
                continue
            args: dict[str, Any] = {}
            for pm in _CODER_PARAM_RE.finditer(body):
                pname, psep, pval = pm.group(1).partition(">")
                if not psep:
                    continue
                pname = pname.strip()
                if pval.startswith("\n"):
                    pval = pval[1:]
                if pval.endswith("\n"):
                    pval = pval[:-1]
                args[pname] = _convert(pval, _schema_type(tools, name, pname))
            calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
    if not calls:
        return ParsedOutput(text or None, [])
    return ParsedOutput(_content_before(text, first), calls)


def parse_llama3_json(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """vLLM's `llama3_json` parser: the whole output is one or more JSON calls separated by ';'."""
    start, _open = _split_reasoning(text)
    body = text[start:].strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].lstrip()
    if not body.startswith("{"):
        return ParsedOutput(text or None, [])
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    i = 0
    try:
        while i < len(body):
            obj, i = decoder.raw_decode(body, i)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("a tool call needs a string 'name'")
            args = obj.get("parameters", obj.get("arguments", {}))
            calls.append(ToolCall(obj["name"], json.dumps(args, ensure_ascii=False)))
            while i < len(body) and body[i] in " \t\r\n;":
                i += 1
    except ValueError:
        return ParsedOutput(text or None, [])
    return ParsedOutput(_content_before(text, start) if start else None, calls)


PARSERS: dict[str, Callable[[str, list[dict[str, Any]] | None], ParsedOutput]] = {
    "hermes": parse_hermes,
    "qwen3_coder": parse_qwen3_coder,
    "llama3_json": parse_llama3_json,
}


def get_parser(name: str | None) -> Callable[[str, list[dict[str, Any]] | None], ParsedOutput] | None:
    """The parser called `name` (None for no parsing); raises `ToolParserError` for an unknown name."""
    if name is None:
        return None
    try:
        return PARSERS[name]
    except KeyError:
        raise ToolParserError(f"unknown tool parser {name!r}; known: {sorted(PARSERS)}") from None
