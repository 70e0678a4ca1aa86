"""Grades the agent's change to an arl SWE task's repository (run by tests/test.sh, as root, in a clean
environment the agent never touched):

    grade_change.py CONFIG BASE TESTBED REPORT_JSON
    grade_change.py --pytest-config BASE        # the repository's own pytest config file ("" if none)

BASE is the task's repository as built (the image's read-only copy), TESTBED the agent's `/testbed` as it
was carried out of the agent's environment after every process of the trial ended. The change is every
path whose type or content differs. Only what a fix may touch is kept; the rest is put back as in BASE
(restored when BASE has it, deleted when the agent added it), each with the reason:

- `test`: the test files (the listed ones, everything under a tests/test/testing dir, `test_*.py`,
  `*_test.py`, every `conftest.py`);
- `runner_config`: files pytest reads its configuration from (`pytest.ini`, `pytest.toml`, `tox.ini`,
  `setup.cfg`, `pyproject.toml`, in any folder);
- `startup`: files the interpreter imports on its own (`sitecustomize.py`, `usercustomize.py`, `*.pth`);
- `compiled`: bytecode and native modules (`__pycache__/`, `*.pyc`, `*.so`, ...), which the import system
  prefers over a `.py` of the same name and which no fix in source needs;
- `shadowing`: a new top-level name on an import root (the repository root, the source root), which
  would shadow the runner, its plugins or the standard library (`pytest.py`, `_pytest/`, `json.py`);
- `symlink` / `special`: links and non-regular files (a fix is plain files).

Git metadata (`.git`) is not part of the change: it is dropped, and nothing here runs git. A kept change
is refused outright (reward 0, `change_refused`) when it adds references to the test harness or to the
interpreter's machinery that a fix has no use for (`pytest`, `os._exit`, `sys.meta_path`, ...; the
task's `reach_patterns`): such code can forge results from inside the test process, which no file rule
can see. Writes REPORT_JSON: {"kept": [...], "restored": {path: reason}, "deleted": {path: reason},
"refused": reason or null, "reach": [...]}. Exit 0, or 10 when the change is refused. Standard library
only (it runs under the task's interpreter).
"""

import hashlib
import json
import os
import re
import shutil
import stat
import sys
import unicodedata

TEST_DIRS = {"tests", "test", "testing"}
RUNNER_CONFIGS = {
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
}
STARTUP_FILES = {"sitecustomize.py", "usercustomize.py"}
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dylib")
# What a fix of a library function has no use for, and what in-process forgery of the runner needs.
DEFAULT_REACH_PATTERNS = [
    r"\bpytest\b",
    r"_pytest",
    r"\bpluggy\b",
    r"arl_swe",
    r"ARL_SWE",
    r"/logs/",
    r"/tests/",
    r"\bsys\.meta_path\b",
    r"\bsys\.path_hooks\b",
    r"\bos\._exit\b",
    r"\bsettrace\b",
    r"\bsetprofile\b",
    r"_getframe",
    r"\batexit\b",
    r"\bctypes\b",
    r"\bgc\.get_(?:objects|referrers)\b",
    r"\bsys\.modules\b",
    r"__import__",
    r"builtins",
    r"\bimportlib\b",
    r"\bexec\s*\(",
    r"\beval\s*\(",
    r"\bcompile\s*\(",
    r"\bmarshal\b",
    r"\bbase64\b",
    r"\bcodecs\.decode\b",
    # An object equal to anything passes every assert-equal test without fixing the function.
    r"\bdef __(?:eq|ne)__\b",
]
_READ_LIMIT = 4 * 1024 * 1024


def _walk(root):
    """rel path -> (kind, digest) for every entry under root; `.git` left out."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = ("symlink", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = ("dir", "")
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
                entries[rel] = ("file", digest.hexdigest())
            else:
                entries[rel] = ("special", "")
    return entries


def protected_reason(rel, kind, added, base, import_roots, test_files):
    """Why a changed path is not the fix's to touch (None: it may be changed)."""
    parts = rel.split("/")
    name = parts[-1]
    if kind == "special":
        return "special"
    if kind == "symlink" or base.get(rel, ("",))[0] == "symlink":
        return "symlink"
    if "__pycache__" in parts or name.endswith(COMPILED_SUFFIXES):
        return "compiled"
    if (
        rel in test_files
        or name == "conftest.py"
        or any(p in TEST_DIRS for p in parts[:-1])
        or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))
        or (kind == "dir" and name in TEST_DIRS)
    ):
        return "test"
    if name in RUNNER_CONFIGS:
        return "runner_config"
    if name in STARTUP_FILES or name.endswith(".pth"):
        return "startup"
    if added:
        for root in import_roots:
            prefix = "" if root in ("", ".") else root.rstrip("/") + "/"
            if not rel.startswith(prefix):
                continue
            top = prefix + rel[len(prefix) :].split("/")[0]
            if top not in base:
                return "shadowing"
    return None


def _reach(path, patterns):
    try:
        with open(path, "rb") as f:
            text = f.read(_READ_LIMIT).decode("utf-8", errors="replace")
    except OSError:
        return {}
    # As Python reads identifiers (NFKC): `_ｐｙｔｅｓｔ` in the source is `_pytest` to the interpreter.
    text = unicodedata.normalize("NFKC", text)
    return {p: len(re.findall(p, text)) for p in patterns}


# Left alone in the carried tree by arl.harbor.carry when the agent's tree was over the carry's size limit.
CARRY_REFUSED_MARKER = ".arl-carry-refused"


def grade(config, base_root, testbed):
    """The verdict on the change (see the module docstring); puts protected paths back in `testbed`."""
    marker = os.path.join(testbed, CARRY_REFUSED_MARKER)
    if (
        os.path.isfile(marker)
        and not os.path.islink(marker)
        and not os.path.lexists(os.path.join(base_root, CARRY_REFUSED_MARKER))
    ):
        with open(marker, errors="replace") as f:
            why = f.read(500).strip()
        return {"kept": [], "restored": {}, "deleted": {}, "refused": f"the agent's tree was not carried: {why}",
                "reach": []}  # fmt: skip
    src_root = config.get("src_root") or "."
    import_roots = ["", src_root] if src_root not in ("", ".") else [""]
    test_files = set(config.get("test_files") or [])
    patterns = config.get("reach_patterns") or DEFAULT_REACH_PATTERNS
    base, agent = _walk(base_root), _walk(testbed)
    kept, restored, deleted, reach = [], {}, {}, []
    for rel in sorted(set(base) | set(agent), key=lambda r: (r.count("/"), r)):
        b, a = base.get(rel), agent.get(rel)
        if a == b or (a is not None and a[0] == "dir" and b is not None and b[0] == "dir"):
            continue
        kind = (a or b)[0]
        reason = protected_reason(rel, kind, b is None, base, import_roots, test_files)
        if reason is None:
            if a is not None and a[0] == "file":
                before = _reach(os.path.join(base_root, rel), patterns) if b is not None else {}
                after = _reach(os.path.join(testbed, rel), patterns)
                reach += [f"{rel}: {p}" for p, n in after.items() if n > before.get(p, 0)]
            kept.append(rel)
        elif b is None:
            deleted[rel] = reason
        else:
            restored[rel] = reason
    for rel in sorted(deleted, key=lambda r: -r.count("/")):
        path = os.path.join(testbed, rel)
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    for rel in sorted(restored, key=lambda r: r.count("/")):
        _restore(os.path.join(base_root, rel), os.path.join(testbed, rel))
    shutil.rmtree(os.path.join(testbed, ".git"), ignore_errors=True)
    refused = None
    if reach:
        refused = "the change reaches into the test harness or the interpreter: " + "; ".join(reach[:8])
    return {"kept": kept, "restored": restored, "deleted": deleted, "refused": refused, "reach": reach}


def _restore(source, target):
    """`target` made exactly as `source` in the base (whatever the agent put there)."""
    if os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.unlink(target)
    parent = os.path.dirname(target)
    if os.path.islink(parent) or (os.path.lexists(parent) and not os.path.isdir(parent)):
        os.unlink(parent)  # a parent the agent turned into a file or link
    os.makedirs(parent, exist_ok=True)
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target)


# Where pytest finds its configuration in a rootdir, in its own order: file -> section that must be in it.
_PYTEST_CONFIG_FILES = (
    ("pytest.toml", None),
    (".pytest.toml", None),
    ("pytest.ini", None),
    (".pytest.ini", None),
    ("pyproject.toml", ("[tool.pytest.ini_options]", "[tool.pytest]")),
    ("tox.ini", ("[pytest]",)),
    ("setup.cfg", ("[tool:pytest]",)),
)


def own_pytest_config(root):
    """The repository's own pytest configuration file under `root`, relative ("" when it has none)."""
    for name, sections in _PYTEST_CONFIG_FILES:
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, errors="replace") as f:
                text = f.read()
            if sections is None or any(section in text for section in sections):
                return name
    return ""


def main():
    if sys.argv[1] == "--pytest-config":  # grade_change.py --pytest-config BASE
        print(own_pytest_config(sys.argv[2]))
        return 0
    config_path, base_root, testbed, report_path = sys.argv[1:5]
    with open(config_path) as f:
        config = json.load(f)
    verdict = grade(config, base_root, testbed)
    with open(report_path, "w") as f:
        json.dump(verdict, f, indent=1)
    touched = len(verdict["restored"]) + len(verdict["deleted"])
    # Counts only on the output: paths are the agent's choice (the details are in REPORT_JSON).
    print(
        f"grade_change: {len(verdict['kept'])} path(s) kept, {touched} put back"
        + (f"; refused ({len(verdict['reach'])} reference(s) to the harness)" if verdict["refused"] else "")
    )
    return 10 if verdict["refused"] else 0


if __name__ == "__main__":
    sys.exit(main())
