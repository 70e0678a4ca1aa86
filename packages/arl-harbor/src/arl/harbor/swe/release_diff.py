"""Split the change between two releases' unpacked sdists into source, test and other files, as patches.

Two releases differ in the package's source, its tests, and packaging or docs (setup.py, PKG-INFO,
CHANGELOG, ...). A task needs the first two apart: the source part is the oracle fix (what an agent must
write), the test part is `tests/test.patch` (applied only by the verifier). A path is a test when the
grader would put it back as one (`grade_change.protected_reason` says "test": test dirs, `test_*.py`,
`conftest.py`), so the agent can never have touched what the patch changes. A path is source when it is
inside one of the package's dirs (a dir of the package's own modules, `validate.source_modules`, with an
`__init__.py`: modules, data, `py.typed`) or a top-level module of the source root (`six.py`), and the
grader would keep an agent's change to it. Everything else (setup.py, pyproject.toml, docs, changelogs)
is left out of both: the task's testbed is the old tree as released. Binary files of either part are
left out too (a text patch cannot carry them).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from arl.harbor.swe import grading
from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.validate import source_modules

Kind = Literal["source", "test", "other"]
_SKIP_PARTS = ("__pycache__", ".git")


@dataclass(frozen=True)
class FileChange:
    """One path that differs between the trees: its text before/after (None: absent then)."""

    path: str
    kind: Kind
    old: str | None
    new: str | None
    binary: bool = False

    @property
    def changed_lines(self) -> int:
        """Added plus removed lines (0 for a binary file)."""
        if self.binary:
            return 0
        old, new = (self.old or "").splitlines(), (self.new or "").splitlines()
        diff = difflib.unified_diff(old, new, n=0, lineterm="")
        return sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))


@dataclass
class ReleaseDiff:
    """The change between two trees, split by kind (paths sorted)."""

    source: list[FileChange] = field(default_factory=list)
    tests: list[FileChange] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    binary: list[str] = field(default_factory=list)  # binary source/test changes: left out of both parts

    @property
    def source_lines(self) -> int:
        return sum(c.changed_lines for c in self.source)

    def test_modules(self) -> list[str]:
        """The test modules (`.py` files other than conftest.py) the test change adds or changes."""
        return [
            c.path
            for c in self.tests
            if c.new is not None and c.path.endswith(".py") and PurePosixPath(c.path).name != "conftest.py"
        ]

    def unreviewable(self, *, max_files: int, max_lines: int) -> str | None:
        """Why the pair cannot be a task on its diff alone (None: it can)."""
        if not self.source:
            return "no source change"
        if not self.test_modules():
            return "no test module change"
        if len(self.source) > max_files:
            return f"source diff over {max_files} files"
        if self.source_lines > max_lines:
            return f"source diff over {max_lines} lines"
        return None

    def source_patch(self) -> str:
        return "".join(file_patch(c) for c in self.source)

    def test_patch(self) -> str:
        return "".join(file_patch(c) for c in self.tests)


def tree_files(root: Path) -> dict[str, Path]:
    """Every regular file under `root` by its posix path (bytecode, caches and .git left out)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(p in _SKIP_PARTS for p in rel.parts) or path.suffix in (".pyc", ".pyo") or path.is_symlink():
            continue
        if path.is_file():
            out[rel.as_posix()] = path
    return out


def _read(path: Path | None) -> tuple[str | None, bool]:
    if path is None:
        return None, False
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, True
    return text, "\x00" in text


def _package_dirs(modules: set[str]) -> set[str]:
    """The package dirs among the modules' folders: those with an `__init__.py` module."""
    return {PurePosixPath(m).parent.as_posix() for m in modules if PurePosixPath(m).name == "__init__.py"}


def classify(path: str, *, src_root: str, modules: set[str], package_dirs: set[str]) -> Kind:
    """Whether a changed path is the package's source, its tests, or neither (see the module docstring)."""
    rules = grading.grade_change_module()
    import_roots = [""] if src_root in ("", ".") else ["", src_root]
    reason = rules.protected_reason(path, "file", False, {}, import_roots, set())
    if reason == "test":
        return "test"
    if reason is not None:
        return "other"
    parents = {p.as_posix() for p in PurePosixPath(path).parents}
    top_level = PurePosixPath(path).parent == PurePosixPath(src_root)
    if parents & package_dirs or (top_level and path in modules):
        return "source"
    return "other"  # a script folder (bin/, tools/) or a top-level non-module file


def diff_trees(old_root: Path, new_root: Path, spec: PackageSpec) -> ReleaseDiff:
    """The change from `old_root` to `new_root`, split into source, test and other paths."""
    old_files, new_files = tree_files(old_root), tree_files(new_root)
    modules = set(source_modules(old_root, spec)) | set(source_modules(new_root, spec))
    package_dirs = _package_dirs(modules)
    diff = ReleaseDiff()
    for path in sorted(set(old_files) | set(new_files)):
        old_path, new_path = old_files.get(path), new_files.get(path)
        if old_path is not None and new_path is not None and old_path.read_bytes() == new_path.read_bytes():
            continue
        kind = classify(path, src_root=spec.src_root, modules=modules, package_dirs=package_dirs)
        if kind == "other":
            diff.other.append(path)
            continue
        (old, old_binary), (new, new_binary) = _read(old_path), _read(new_path)
        if old_binary or new_binary:
            # A text patch cannot carry it (the grader and solve.sh apply patches with `patch`). Leaving it
            # out of both trees the tests are selected on keeps FAIL_TO_PASS true to the task: a test that
            # needs it (a compiled .mo catalogue, a data file) passes in neither and is not listed.
            diff.binary.append(path)
            continue
        (diff.source if kind == "source" else diff.tests).append(FileChange(path, kind, old, new))
    return diff


def file_patch(change: FileChange) -> str:
    """A git-style diff of one text file that `patch -p1` and `git apply` both apply (adds, deletes too)."""
    if change.binary:
        raise ValueError(f"{change.path}: a binary change cannot be written as a text patch")
    path = change.path
    out = [f"diff --git a/{path} b/{path}\n"]
    if change.old is None:
        out += ["new file mode 100644\n", "--- /dev/null\n", f"+++ b/{path}\n"]
    elif change.new is None:
        out += ["deleted file mode 100644\n", f"--- a/{path}\n", "+++ /dev/null\n"]
    else:
        out += [f"--- a/{path}\n", f"+++ b/{path}\n"]
    before = (change.old or "").splitlines(keepends=True)
    after = (change.new or "").splitlines(keepends=True)
    for line in list(difflib.unified_diff(before, after, n=3))[2:]:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def apply_changes(root: Path, changes: list[FileChange]) -> None:
    """Write each change's new text into the tree at `root` (deleting the files it deletes)."""
    for change in changes:
        target = root / change.path
        if change.new is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(change.new)
