"""Every import of every module of the packages and apps follows the layers of docs/ARCHITECTURE.md.

The allowed layers are the package table of docs/ARCHITECTURE.md ("may depend on"), read from there, so
they are written down once. Each `.py` under `packages/*/src` and `apps/*/src` is read with `ast` (nothing
is imported) and every import counts, inside functions and under `if TYPE_CHECKING:` too: an import put
in a function is still a dependency, and fails only later, when that function runs in an environment
with the package installed alone. The rules:

- an arl package or app is imported only where its row lists it ("all of the above": every row above
  it); so nothing imports up the table and no package imports an app;
- torch, vllm and ray, which a light package must work without, are imported only where the row lists
  them; one listed as `(extra)` only inside a function or under `if TYPE_CHECKING:`, so the module
  imports without the extra;
- a package's declared dependencies (pyproject.toml) name the same arl packages, torch and ray as its row.

Other third-party imports are the release check's (scripts/release_check.py installs each package alone).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
# The heavy dependencies named by the architecture's light-package rule ("without torch, vllm or ray").
GUARDED = ("torch", "vllm", "ray")


@dataclass
class Unit:
    """One row of the package table: a package (`arl-queue`) or an app (`apps/train`)."""

    name: str
    module: str  # import name: "arl.queue", "arl_train"
    src: Path  # the folder of its modules
    allowed: set[str] = field(default_factory=set)  # units and guarded modules it may import anywhere
    extras: set[str] = field(default_factory=set)  # guarded modules it may import only inside functions


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is, and whether it runs when the module is imported."""

    path: Path
    line: int
    module: str
    at_import: bool  # False: inside a function or under `if TYPE_CHECKING:`


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _app_module(folder: Path) -> str:
    """The import name of an app: the one package under its src/ (apps/train/src/arl_train → arl_train)."""
    found = [p.parent.name for p in (folder / "src").glob("*/__init__.py")]
    assert len(found) == 1, f"{folder}/src should hold one package, found {found}"
    return found[0]


def read_table(text: str, repo: Path = REPO) -> dict[str, Unit]:
    """The units of the architecture's package table, in its order, with what each may import."""
    section = text.split("## The packages and what each owns", 1)[1].split("\n## ", 1)[0]
    rows = [_cells(line) for line in section.splitlines() if line.startswith("|")][2:]  # header, rule
    units: dict[str, Unit] = {}
    for name, module_cell, _owns, depends in rows:
        if name.startswith("apps/"):
            unit = Unit(name, _app_module(repo / name), repo / name / "src")
        else:
            module = module_cell.strip("`")
            unit = Unit(name, module, repo / "packages" / name / "src" / module.replace(".", "/"))
        for item in re.split(r"[,;]", depends):
            dep = re.sub(r"\(.*?\)", "", item).strip()
            if dep == "all of the above":
                for above in units.values():
                    unit.allowed |= {above.name} | above.allowed | above.extras
            elif "(extra)" in item:
                unit.extras.add(dep)
            else:
                unit.allowed.add(dep)
        units[name] = unit
    return units


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path) -> list[Import]:
    """Every absolute import in the module at `path` (relative ones stay inside its own package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[Import] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            at_import = False
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, at_import)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(path, node.lineno, a.name, at_import) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from arl import queue` imports arl.queue; `from arl.queue import Sample` imports arl.queue.
            names = [f"arl.{a.name}" for a in node.names] if node.module == "arl" else [node.module]
            found.extend(Import(path, node.lineno, n, at_import) for n in names)
        for child in ast.iter_child_nodes(node):
            visit(child, at_import)

    visit(tree, True)
    return found


def owner(module: str, units: dict[str, Unit]) -> str | None:
    """The unit (or guarded module) an imported module belongs to; None for anything else."""
    for unit in units.values():
        if module == unit.module or module.startswith(unit.module + "."):
            return unit.name
    root = module.split(".")[0]
    return root if root in GUARDED else None


def violations(unit: Unit, units: dict[str, Unit], repo: Path = REPO) -> list[str]:
    """What `unit`'s modules import against the table, one line each."""
    problems = []
    for path in sorted(unit.src.rglob("*.py")):
        for imp in imports_of(path):
            target = owner(imp.module, units)
            if target is None or target == unit.name or target in unit.allowed:
                continue
            where = f"{path.relative_to(repo)}:{imp.line} imports {imp.module}"
            if target in unit.extras:
                if imp.at_import:
                    problems.append(
                        f"{where} when the module is imported, but {target} is an extra of "
                        f"{unit.name}: import it inside the function that needs it"
                    )
                continue
            listed = ", ".join(sorted(unit.allowed | {f"{e} (extra)" for e in unit.extras})) or "nothing"
            inside = "" if imp.at_import else " (inside a function)"
            problems.append(f"{where}{inside}, but {unit.name} may depend on: {listed}")
    return problems


def declared(unit: Unit, units: dict[str, Unit], repo: Path = REPO) -> set[str]:
    """The arl packages, torch and ray among a package's declared (not optional) dependencies."""
    project = tomllib.loads((repo / "packages" / unit.name / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in project.get("dependencies", [])}
    return names & ({*units} | set(GUARDED))


UNITS = read_table(ARCHITECTURE.read_text())


def test_the_table_names_every_package_and_app():
    assert {u for u in UNITS if not u.startswith("apps/")} == {
        p.name for p in (REPO / "packages").iterdir() if (p / "pyproject.toml").is_file()
    }
    assert {u for u in UNITS if u.startswith("apps/")} == {
        f"apps/{p.name}" for p in (REPO / "apps").iterdir() if (p / "pyproject.toml").is_file()
    }
    for unit in UNITS.values():
        assert unit.src.is_dir(), f"{unit.name}: no {unit.src}"
    modules = {*REPO.glob("packages/*/src/**/*.py"), *REPO.glob("apps/*/src/**/*.py")}
    checked = {path for unit in UNITS.values() for path in unit.src.rglob("*.py")}
    assert modules == checked, f"modules outside every row's folder: {sorted(map(str, modules - checked))}"
    assert UNITS["arl-queue"].allowed & {*GUARDED, *UNITS} == set()
    assert UNITS["arl-queue"].extras == {"ray"}
    assert UNITS["arl-rollout"].allowed >= {"arl-queue", "arl-proxy", "arl-sync", "ray", "torch"}
    assert "arl-rollout" in UNITS["apps/train"].allowed and "apps/train" in UNITS["apps/bench"].allowed


@pytest.mark.parametrize("name", list(UNITS))
def test_imports_follow_the_layers(name):
    problems = violations(UNITS[name], UNITS)
    assert not problems, "imports against docs/ARCHITECTURE.md's package table:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", [u for u in UNITS if not u.startswith("apps/")])
def test_declared_dependencies_match_the_table(name):
    unit = UNITS[name]
    in_table = unit.allowed & ({*UNITS} | set(GUARDED))
    assert declared(unit, UNITS) == in_table, (
        f"{name}'s pyproject.toml declares {sorted(declared(unit, UNITS))} of the arl packages, torch and "
        f"ray; docs/ARCHITECTURE.md's table lists {sorted(in_table)}"
    )


def test_the_checker_sees_imports_in_functions_and_extras_at_import_time(tmp_path):
    table = """## The packages and what each owns

| distribution | import | owns | may depend on |
|---|---|---|---|
| arl-low | `arl.low` | low things | msgspec; ray (extra) |
| arl-high | `arl.high` | high things | arl-low, torch |
| apps/app | (app) | composing | all of the above |

## Next
"""
    (tmp_path / "apps" / "app" / "src" / "the_app").mkdir(parents=True)
    (tmp_path / "apps" / "app" / "src" / "the_app" / "__init__.py").write_text("")
    low = tmp_path / "packages" / "arl-low" / "src" / "arl" / "low"
    low.mkdir(parents=True)
    (low / "ok.py").write_text(
        "from typing import TYPE_CHECKING\nimport msgspec\nif TYPE_CHECKING:\n    import ray\n"
        "def actor():\n    import ray\n    return ray\n"
    )
    (low / "up.py").write_text("def f():\n    from arl.high.x import y\n    from the_app.run import run\n")
    (low / "eager.py").write_text(
        "try:\n    import ray\nexcept ImportError:\n    ray = None\nclass C:\n    import torch\n"
    )
    units = read_table(table, tmp_path)
    assert units["arl-high"].allowed == {"arl-low", "torch"}
    assert units["apps/app"].module == "the_app"
    assert units["apps/app"].allowed == {"arl-low", "arl-high", "msgspec", "ray", "torch"}
    problems = violations(units["arl-low"], units, tmp_path)
    assert [p.split(" imports ")[0] for p in problems] == [
        "packages/arl-low/src/arl/low/eager.py:2",
        "packages/arl-low/src/arl/low/eager.py:6",
        "packages/arl-low/src/arl/low/up.py:2",
        "packages/arl-low/src/arl/low/up.py:3",
    ]
    assert "ray is an extra of arl-low" in problems[0]
    assert "(inside a function), but arl-low may depend on: msgspec, ray (extra)" in problems[2]
