"""Break one function procedurally with SWE-smith's Python modifiers (the `swesmith` package, libcst).

SWE-smith (2025) makes SWE tasks by rewriting a function's code with small procedural modifiers
(`swesmith.bug_gen.procedural.python`): invert an if/else, shuffle a function's statements, remove an
assignment / conditional / loop / try-with wrapper, change or flip an operator, swap operands, change a
constant, break an operation chain. They run on any local source file (no network, no Docker); this
module feeds them one function at a time and splices the rewrite back into its file, so that the diff
touches only the lines that changed.

`function_entities(path)` lists the functions of a file (qualified names), `mutate(...)` applies one
operator to one function and returns the new file text (None when the operator does not apply or the
result is not a different valid module). Given the same seed, the same mutation comes out.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _import_swesmith_python() -> tuple[dict[str, type], type]:
    """swesmith's Python modifier classes by name, and its Python entity class.

    swesmith's `bug_gen.procedural` and `bug_gen.adapters` package inits import every language's
    tree-sitter grammar; the Python parts need only libcst and astor. So the two packages are registered
    without running their inits (their submodules import as usual).
    """
    for name in ("swesmith.bug_gen.procedural", "swesmith.bug_gen.adapters"):
        if name not in sys.modules:
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise ImportError(f"{name} not found: is the swesmith package installed?")
            sys.modules[name] = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # astor (imported by the adapter) still names ast.Num
        warnings.simplefilter("ignore", DeprecationWarning)
        from swesmith.bug_gen.adapters.python import PythonEntity
    from swesmith.bug_gen.procedural.python import control_flow, operations, remove

    classes = [
        control_flow.ControlIfElseInvertModifier,
        control_flow.ControlShuffleLinesModifier,
        remove.RemoveAssignModifier,
        remove.RemoveConditionalModifier,
        remove.RemoveLoopModifier,
        remove.RemoveWrapperModifier,
        operations.OperationBreakChainsModifier,
        operations.OperationChangeConstantsModifier,
        operations.OperationChangeModifier,
        operations.OperationSwapOperandsModifier,
    ]
    return {c.name: c for c in classes}, PythonEntity


MODIFIERS, _PythonEntity = _import_swesmith_python()
# The function-level operators, by SWE-smith's names (e.g. "func_pm_ctrl_invert_if"). Its class-level
# ones (remove bases / methods, shuffle methods) are left out: the tasks are about broken functions.
OPERATORS: tuple[str, ...] = tuple(sorted(MODIFIERS))
# SWE-smith's own likelihoods of touching each eligible node (swesmith.bug_gen.procedural.python).
_LIKELIHOOD = {
    "func_pm_op_break_chains": 0.4,
    "func_pm_op_change_const": 0.4,
    "func_pm_op_change": 0.4,
    "func_pm_op_swap": 0.4,
}


@dataclass(frozen=True)
class FunctionEntity:
    """One function of a source file: its qualified name and its lines (1-based, inclusive)."""

    qualname: str
    line_start: int
    line_end: int
    indent: str
    node: Any  # ast.FunctionDef


def function_entities(source: str) -> list[FunctionEntity]:
    """Every (non-async) function and method of `source`, in file order, with qualified names."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out: list[FunctionEntity] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef):
                qual = f"{prefix}{child.name}"
                first = lines[child.lineno - 1]
                out.append(
                    FunctionEntity(
                        qual,
                        child.lineno,
                        child.end_lineno or child.lineno,
                        first[: len(first) - len(first.lstrip())],
                        child,
                    )
                )
                walk(child, f"{qual}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.AsyncFunctionDef):
                walk(child, f"{prefix}{child.name}.<locals>.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _dedent(lines: list[str], indent: str) -> list[str] | None:
    out = []
    for line in lines:
        if line.startswith(indent):
            out.append(line[len(indent) :])
        elif not line.strip():
            out.append(line)
        else:
            return None  # a line (e.g. inside a multi-line string) is indented less than the def
    return out


def _indent(lines: list[str], indent: str) -> list[str]:
    return [indent + line if line.strip() else line for line in lines]


def seed_for(*parts: object) -> int:
    """A stable 32-bit seed from the parts (independent of hash randomisation and of run order)."""
    return zlib.crc32(":".join(map(str, parts)).encode())


def mutate(source: str, entity: FunctionEntity, operator: str, *, seed: int) -> str | None:
    """`source` with `operator` applied to `entity`, or None when it does not apply or changes nothing."""
    if operator not in MODIFIERS:
        raise ValueError(f"unknown operator {operator!r}; known: {list(OPERATORS)}")
    no_final_newline = bool(source) and not source.endswith("\n")
    lines = (source + "\n" if no_final_newline else source).splitlines(keepends=True)
    body = lines[entity.line_start - 1 : entity.line_end]
    dedented = _dedent(body, entity.indent)
    if dedented is None or _indent(dedented, entity.indent) != body:
        return None
    code_entity = _PythonEntity(
        file_path="<mutate>.py",
        indent_level=0,
        indent_size=4,
        line_start=entity.line_start,
        line_end=entity.line_end,
        node=entity.node,
        src_code="".join(dedented),
    )
    modifier = MODIFIERS[operator](likelihood=_LIKELIHOOD.get(operator, 0.25), seed=seed)
    if not modifier.can_change(code_entity):
        return None
    try:
        rewrite = modifier.modify(code_entity)
    except Exception:  # noqa: BLE001 - a modifier that trips on unusual code just does not apply
        return None
    if rewrite is None or not rewrite.rewrite.strip():
        return None
    new_body = rewrite.rewrite.splitlines(keepends=True)
    if not new_body[-1].endswith("\n"):
        new_body[-1] += "\n"
    new = "".join(
        lines[: entity.line_start - 1] + _indent(new_body, entity.indent) + lines[entity.line_end :]
    )
    try:
        changed = ast.dump(ast.parse(new)) != ast.dump(ast.parse(source))
    except SyntaxError:
        return None
    if no_final_newline:  # the file keeps its missing final newline: the diff shows only the bug
        new = new[:-1]
    return new if changed else None


def mutate_file(path: Path, qualname: str, operator: str, *, seed: int) -> str | None:
    """`mutate` on the function `qualname` of the file at `path` (None when absent or not applicable)."""
    source = path.read_text()
    for entity in function_entities(source):
        if entity.qualname == qualname:
            return mutate(source, entity, operator, seed=seed)
    return None
