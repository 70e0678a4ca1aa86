"""SWE-smith's procedural operators as arl.harbor.swe.mutate applies them: each one, on a small function,
gives a valid, different module whose reverse patch restores the source exactly."""

from __future__ import annotations

import ast
import shutil
import subprocess

import pytest

from arl.harbor.swe.mutate import OPERATORS, function_entities, mutate, mutate_file, seed_for
from arl.harbor.swe.testing import TINY_SOURCE
from arl.harbor.swe.writer import unified_patch


def _first_mutation(source: str, qualname: str, operator: str) -> str | None:
    entity = next(e for e in function_entities(source) if e.qualname == qualname)
    for seed in range(40):  # the modifiers pick nodes at random; some seeds touch nothing
        out = mutate(source, entity, operator, seed=seed)
        if out is not None:
            return out
    return None


def _reverse_patch_restores(tmp_path, original: str, buggy: str) -> None:
    (tmp_path / "pkg").mkdir()
    target = tmp_path / "pkg" / "mod.py"
    target.write_text(buggy)
    patch = unified_patch("pkg/mod.py", buggy, original)
    subprocess.run(
        ["patch", "-p1", "--batch", "--forward"],
        input=patch,
        text=True,
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert target.read_text() == original


def test_every_function_level_operator_is_there():
    assert set(OPERATORS) == {
        "func_pm_ctrl_invert_if",
        "func_pm_ctrl_shuffle",
        "func_pm_remove_assign",
        "func_pm_remove_cond",
        "func_pm_remove_loop",
        "func_pm_remove_wrapper",
        "func_pm_op_break_chains",
        "func_pm_op_change_const",
        "func_pm_op_change",
        "func_pm_op_swap",
    }


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
@pytest.mark.parametrize("operator", OPERATORS)
def test_operator_gives_a_different_valid_module_and_the_reverse_patch_restores_it(tmp_path, operator):
    qualname = {"func_pm_ctrl_invert_if": "clamp", "func_pm_remove_loop": "digits"}.get(
        operator, "weighted_total"
    )
    buggy = _first_mutation(TINY_SOURCE, qualname, operator)
    assert buggy is not None, f"{operator} did not apply to {qualname}"
    assert ast.dump(ast.parse(buggy)) != ast.dump(ast.parse(TINY_SOURCE))
    # Only the function's lines change; the rest of the file is byte-identical.
    entity = next(e for e in function_entities(TINY_SOURCE) if e.qualname == qualname)
    before, after = TINY_SOURCE.splitlines(), buggy.splitlines()
    assert before[: entity.line_start - 1] == after[: entity.line_start - 1]
    _reverse_patch_restores(tmp_path, TINY_SOURCE, buggy)


def test_methods_keep_their_indentation_and_get_qualified_names(tmp_path):
    entities = {e.qualname: e for e in function_entities(TINY_SOURCE)}
    assert {"clamp", "weighted_total", "digits", "Counter.__init__", "Counter.add"} <= set(entities)
    buggy = _first_mutation(TINY_SOURCE, "Counter.add", "func_pm_ctrl_invert_if")
    assert buggy is not None
    changed = [b for a, b in zip(TINY_SOURCE.splitlines(), buggy.splitlines(), strict=True) if a != b]
    assert changed and all(line.startswith("            ") or line.startswith("        ") for line in changed)
    _reverse_patch_restores(tmp_path, TINY_SOURCE, buggy)


def test_same_seed_same_mutation_and_missing_final_newline_is_kept(tmp_path):
    source = TINY_SOURCE.rstrip("\n")  # a file without a final newline (boltons has some)
    path = tmp_path / "m.py"
    path.write_text(source)
    seed = seed_for(0, "tinycalc", "Counter.add", "func_pm_op_change")
    first = mutate_file(path, "Counter.add", "func_pm_op_swap", seed=seed)
    second = mutate_file(path, "Counter.add", "func_pm_op_swap", seed=seed)
    assert first is not None and first == second
    assert not first.endswith("\n")
    _reverse_patch_restores(tmp_path, source, first)


def test_operator_that_does_not_apply_gives_none():
    # `__init__` has no loop, if or binary operation: nothing for these operators to do.
    entity = next(e for e in function_entities(TINY_SOURCE) if e.qualname == "Counter.__init__")
    for op in ("func_pm_remove_loop", "func_pm_ctrl_invert_if", "func_pm_op_change"):
        assert mutate(TINY_SOURCE, entity, op, seed=1) is None
    with pytest.raises(ValueError, match="unknown operator"):
        mutate(TINY_SOURCE, entity, "no_such_op", seed=1)
