"""No import circles among arl_train's modules (read statically with ast: nothing is imported).

Every `import arl_train.x` / `from arl_train(.x) import ...` counts, inside functions too: an import
put in a function to dodge a circle is still a circle. Only `if TYPE_CHECKING:` blocks are left out
(they never run).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "arl_train"


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped |= {id(n) for n in ast.walk(child)}
    return skipped


def _imports(path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_blocks(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from .x import y / from . import x
            names = [f"arl_train.{node.module}" if node.module else ""]
            names += [f"arl_train.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "arl_train" and len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
    return found - {path.stem}


def import_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {p.stem: _imports(p, modules) for p in PACKAGE.glob("*.py")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_checker_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n\ndef f():\n    from arl_train.config import load_config\n"
        "if TYPE_CHECKING:\n    from arl_train.run import run\n"
    )
    assert _imports(module, {"config", "run"}) == {"config"}


def test_arl_train_has_no_import_cycle():
    graph = import_graph()
    assert {"config", "sections", "validation", "placement", "actors", "harbor_section"} <= set(graph)
    cycle = find_cycle(graph)
    if cycle:
        pytest.fail("import cycle among arl_train's modules: " + " -> ".join(cycle))
