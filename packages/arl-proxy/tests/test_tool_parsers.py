"""Tool-call parsers behave like vLLM's: several calls, text before, unclosed last call, malformed JSON,
calls inside <think>, schema-typed values (qwen3_coder)."""

from __future__ import annotations

import json

import pytest
from arl_proxy_helpers import TOOLS

from arl.proxy.errors import ToolParserError
from arl.proxy.tool_parsers import get_parser, parse_hermes, parse_llama3_json, parse_qwen3_coder

CODER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "i": {"type": "integer"},
                    "x": {"type": "number"},
                    "b": {"type": "boolean"},
                    "o": {"type": "object"},
                    "a": {"type": "array"},
                    "n": {"type": ["string", "null"]},
                },
            },
        },
    }
]


def args(call):
    return json.loads(call.arguments)


def test_hermes_several_calls_with_text_before():
    out = parse_hermes(
        'Let me check.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>',
        TOOLS,
    )
    assert out.content == "Let me check."
    assert [(c.name, args(c)) for c in out.tool_calls] == [
        ("bash", {"cmd": "ls"}),
        ("read_file", {"path": "a"}),
    ]
    assert out.tool_calls[0].id != out.tool_calls[1].id and out.tool_calls[0].id.startswith("call_")


def test_hermes_unclosed_last_call_and_no_content():
    out = parse_hermes(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
        '{"name": "b", "arguments": {"k": 1}}',
        TOOLS,
    )
    assert out.content is None and [c.name for c in out.tool_calls] == ["a", "b"]
    assert args(out.tool_calls[1]) == {"k": 1}


def test_hermes_malformed_json_returns_everything_as_content():
    text = 'Try.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}\n</tool_call>'
    out = parse_hermes(text, TOOLS)
    assert out.content == text and out.tool_calls == []
    assert parse_hermes("<tool_call>[1, 2]</tool_call>", TOOLS).tool_calls == []


def test_hermes_tool_call_inside_think_is_reasoning():
    text = (
        '<think>\nMaybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?\n</think>\n\nNo call needed.'
    )
    out = parse_hermes(text, TOOLS)
    assert out.tool_calls == [] and out.content == text
    unclosed = '<think>\nI could <tool_call>{"name": "x", "arguments": {}}</tool_call>'
    assert parse_hermes(unclosed, TOOLS).tool_calls == []
    after = (
        '<think>\n<tool_call>{"name": "x", "arguments": {}}</tool_call>\n</think>\n\n'
        '<tool_call>\n{"name": "y", "arguments": {}}\n</tool_call>'
    )
    out = parse_hermes(after, TOOLS)
    assert [c.name for c in out.tool_calls] == ["y"]
    assert out.content == '<think>\n<tool_call>{"name": "x", "arguments": {}}</tool_call>\n</think>\n'


def test_qwen3_coder_schema_conversion():
    text = (
        "Calling.\n<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=i>\n7\n</parameter>\n"
        '<parameter=x>\n2.5\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{"k": [1]}\n'
        "</parameter>\n<parameter=a>\n[1, 'two']\n</parameter>\n<parameter=n>\nnull\n</parameter>\n"
        "<parameter=extra>\nmulti\nline\n</parameter>\n</function>\n</tool_call>"
    )
    out = parse_qwen3_coder(text, CODER_TOOLS)
    assert out.content == "Calling."
    assert args(out.tool_calls[0]) == {
        "s": "42",
        "i": 7,
        "x": 2.5,
        "b": True,
        "o": {"k": [1]},
        "a": [1, "two"],
        "n": None,
        "extra": "multi\nline",
    }


def test_qwen3_coder_several_unclosed_and_think():
    text = (
        "<think>\n<tool_call><function=g></function></tool_call>\n</think>\n\n"
        "<tool_call>\n<function=f>\n<parameter=i>\n1\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=f>\n<parameter=i>\n2\n"
    )
    out = parse_qwen3_coder(text, CODER_TOOLS)
    assert [args(c) for c in out.tool_calls] == [{"i": 1}, {"i": 2}]
    assert parse_qwen3_coder("<tool_call>garbage</tool_call>", CODER_TOOLS).tool_calls == []
    assert (
        parse_qwen3_coder("<tool_call>garbage</tool_call>", CODER_TOOLS).content
        == "<tool_call>garbage</tool_call>"
    )


def test_llama3_json():
    out = parse_llama3_json(
        '{"name": "bash", "parameters": {"cmd": "ls"}}; {"name": "b", "arguments": {}}', TOOLS
    )
    assert [(c.name, args(c)) for c in out.tool_calls] == [("bash", {"cmd": "ls"}), ("b", {})]
    assert out.content is None
    assert parse_llama3_json("Just text.", TOOLS).tool_calls == []
    assert (
        parse_llama3_json('{"name": "bash", "parameters": ', TOOLS).content
        == '{"name": "bash", "parameters": '
    )


def test_unknown_parser():
    assert get_parser(None) is None
    with pytest.raises(ToolParserError):
        get_parser("nope")
