"""Tools an agent loop can offer the model: a name, an OpenAI JSON schema, and a Python function.

Tool functions take the call's parsed arguments and return text for the `tool` message. A tool that
raises returns its error as text (the model sees it, as it would from a real environment); the
trajectory goes on.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

ToolFn = Callable[..., str | Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    fn: ToolFn

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses); no names, no calls."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    value = _evaluate(ast.parse(expression, mode="eval"))
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression, e.g. '(3 + 4) * 12'.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "the expression"}},
        "required": ["expression"],
    },
    fn=calculate,
)

BUILTIN_TOOLS: Mapping[str, Tool] = {CALCULATOR.name: CALCULATOR}
