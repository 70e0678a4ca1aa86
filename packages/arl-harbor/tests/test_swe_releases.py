"""The release-history builder's logic on small in-repo trees (no network): splitting a release's change
into source / test / other files, the patches that re-create it, the size caps, FAIL_TO_PASS selection,
changelog entries, PyPI's release list; and, marked slow and downloading from PyPI, one real fix
(parse 1.22.2 -> 1.22.3) built into a task that passes the oracle / untouched / edited-tests checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.release_diff import FileChange, apply_changes, diff_trees, file_patch, tree_files
from arl.harbor.swe.release_index import ReleaseIndexError, consecutive_pairs, releases_from_json, version_key
from arl.harbor.swe.release_notes import entry_in_text, find_entry, write_release_issue
from arl.harbor.swe.release_tests import select_tests
from arl.harbor.swe.releases import detect_src_root
from arl.harbor.swe.venvs import DEBIAN_PYTHON


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


OLD = {
    "PKG-INFO": "Version: 1.0\n",
    "setup.py": "setup(version='1.0')\n",
    "CHANGELOG.md": "## 1.0\n\n- First.\n",
    "pyproject.toml": "[tool.pytest.ini_options]\n",
    "conftest.py": "",
    "bin/tool.py": "print('tool')\n",
    "tinypkg/__init__.py": "__version__ = '1.0'\n",
    "tinypkg/core.py": "def add(a, b):\n    return a - b\n\n\ndef gone():\n    return 1\n",
    "tinypkg/old.py": "X = 1\n",
    "tests/test_core.py": "from tinypkg.core import add\n\n\ndef test_add_zero():\n"
    "    assert add(1, 0) == 1\n",
}
NEW = {
    **{k: v for k, v in OLD.items() if k != "tinypkg/old.py"},
    "PKG-INFO": "Version: 1.1\n",
    "setup.py": "setup(version='1.1')\n",
    "CHANGELOG.md": "## 1.1\n\n- Fixed `add`.\n\n## 1.0\n\n- First.\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-q'\n",
    "bin/tool.py": "print('tool 2')\n",
    "tinypkg/__init__.py": "__version__ = '1.1'\n",
    "tinypkg/core.py": "def add(a, b):\n    return a + b\n\n\ndef gone():\n    return 1\n",
    "tinypkg/helpers.py": "",  # a new empty module
    "tinypkg/py.typed": "",
    "tests/test_core.py": OLD["tests/test_core.py"] + "\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "tests/data/case.txt": "1 2 3\n",
}
SPEC = PackageSpec("tinypkg", "1.0")


def test_release_diff_splits_source_tests_and_the_rest(tmp_path):
    old, new = _tree(tmp_path / "old", OLD), _tree(tmp_path / "new", NEW)
    diff = diff_trees(old, new, SPEC)
    assert [c.path for c in diff.source] == [
        "tinypkg/__init__.py",
        "tinypkg/core.py",
        "tinypkg/helpers.py",
        "tinypkg/old.py",
        "tinypkg/py.typed",
    ]
    assert [c.path for c in diff.tests] == ["tests/data/case.txt", "tests/test_core.py"]
    # Packaging, docs, runner config and scripts outside the package are in neither part.
    assert diff.other == ["CHANGELOG.md", "PKG-INFO", "bin/tool.py", "pyproject.toml", "setup.py"]
    assert diff.test_modules() == ["tests/test_core.py"]
    assert diff.source_lines == 2 + 2 + 1  # version, the fix, the deleted module's line
    assert diff.unreviewable(max_files=5, max_lines=100) is None
    assert diff.unreviewable(max_files=4, max_lines=100) == "source diff over 4 files"
    assert diff.unreviewable(max_files=5, max_lines=4) == "source diff over 4 lines"


def test_release_diff_reasons_and_src_layout(tmp_path):
    old = _tree(
        tmp_path / "old",
        {"src/lib/__init__.py": "A = 1\n", "tests/test_a.py": "def test(): pass\n", "README.md": "x\n"},
    )
    assert detect_src_root(old) == "src" and detect_src_root(tmp_path / "nowhere") == "."
    spec = PackageSpec("lib", "1", src_root="src")
    only_docs = _tree(
        tmp_path / "docs",
        {"src/lib/__init__.py": "A = 1\n", "tests/test_a.py": "def test(): pass\n", "README.md": "y\n"},
    )
    assert diff_trees(old, only_docs, spec).unreviewable(max_files=5, max_lines=100) == "no source change"
    no_tests = _tree(
        tmp_path / "src-only", {"src/lib/__init__.py": "A = 2\n", "tests/test_a.py": "def test(): pass\n"}
    )
    diff = diff_trees(old, no_tests, spec)
    assert [c.path for c in diff.source] == ["src/lib/__init__.py"]
    assert diff.unreviewable(max_files=5, max_lines=100) == "no test module change"
    binary = _tree(tmp_path / "bin", {"src/lib/__init__.py": "A = 2\n", "tests/test_a.py": "def test(): 1\n"})
    (binary / "src/lib/data.mo").write_bytes(b"\x00\xde\xad")
    (binary / "tests/data.bin").write_bytes(b"\x00\x01")
    diff = diff_trees(old, binary, spec)  # binary files are in neither part: a text patch cannot carry them
    assert diff.binary == ["src/lib/data.mo", "tests/data.bin"]
    assert [c.path for c in diff.source] == ["src/lib/__init__.py"]
    assert [c.path for c in diff.tests] == ["tests/test_a.py"]
    assert diff.unreviewable(max_files=5, max_lines=100) is None
    with pytest.raises(ValueError, match="binary"):
        file_patch(FileChange("src/lib/data.mo", "source", None, None, binary=True))


def test_release_patches_recreate_the_new_tree(tmp_path):
    """The oracle and test patches, applied with the grader's and solve.sh's `patch -p1`, give exactly the
    new release's source and tests (adds, deletes and an empty new file included); apply_changes agrees."""
    old, new = _tree(tmp_path / "old", OLD), _tree(tmp_path / "new", NEW)
    diff = diff_trees(old, new, SPEC)
    patched = tmp_path / "patched"
    shutil.copytree(old, patched)
    for patch in (diff.source_patch(), diff.test_patch()):
        subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "--quiet"],
            cwd=patched,
            input=patch,
            text=True,
            check=True,
            timeout=60,
        )
    written = tmp_path / "written"
    shutil.copytree(old, written)
    apply_changes(written, diff.source + diff.tests)
    kept = {c.path for c in diff.source + diff.tests}
    for tree in (patched, written):
        files = tree_files(tree)
        assert {p for p in files if p in kept} == {p for p in tree_files(new) if p in kept}
        for path in kept - {"tinypkg/old.py"}:
            assert files[path].read_text() == (new / path).read_text(), path
        assert not (tree / "tinypkg/old.py").exists()
        assert (tree / "setup.py").read_text() == OLD["setup.py"]  # the rest stays as released


def test_select_tests_fail_to_pass_pass_to_pass_and_flaky():
    before = [
        {"test_t.py::p2p", "test_t.py::flaky_old", "test_t.py::broken_by_fix", "conf.py::x"},
        {"test_t.py::p2p", "test_t.py::broken_by_fix", "conf.py::x"},
    ]
    after = [
        {
            "test_t.py::p2p",
            "test_t.py::f2p",
            "test_t.py::flaky_old",
            "test_t.py::flaky_new",
            "test_t.py::f2p_b",
            "conf.py::x",
        },
        {"test_t.py::p2p", "test_t.py::f2p", "test_t.py::flaky_old", "test_t.py::f2p_b", "conf.py::x"},
    ]
    sel = select_tests(before, after)
    assert sel.fail_to_pass == ["test_t.py::f2p", "test_t.py::f2p_b"]
    # conf.py is not a test module; flaky_old passed in one run before only
    assert sel.pass_to_pass == ["test_t.py::p2p"]
    assert sel.flaky == ["test_t.py::flaky_new", "test_t.py::flaky_old"]
    assert sel.reject is None and sel.test_files() == ["test_t.py"]
    assert select_tests([{"test_t.py::a"}], [{"test_t.py::a"}]).reject == "no FAIL_TO_PASS"
    with pytest.raises(ValueError, match="at least one run"):
        select_tests([], [{"test_t.py::a"}])


def test_changelog_entries_in_the_usual_styles(tmp_path):
    md = "# Changelog\n\n## 2.0.1\n\n_(June 1)_\n\n- Fixed `x`.\n\n## 2.0.0\n\n- Big.\n"
    assert entry_in_text(md, "2.0.1") == "_(June 1)_\n\n- Fixed `x`."
    assert entry_in_text(md, "2.0") is None  # 2.0.1 / 2.0.0 are not 2.0
    rst = (
        "v8.0.3 (2026-11-25)\n===================\n\n- Fix recursion.\n\n\n"
        "v8.0.2 (2026-11-18)\n====\n\n- Old.\n"
    )
    assert entry_in_text(rst, "8.0.3") == "- Fix recursion."
    items = "Changelog\n---------\n\n- 1.22.3 Preserve offsets\n  in time results\n- 1.22.2 Fix decimals\n"
    assert entry_in_text(items, "1.22.3") == "Preserve offsets\nin time results"
    assert entry_in_text(items, "1.22.4") is None
    toc = "## 3.1\n\n## 3.0\n\n- Real entry.\n"
    assert entry_in_text(toc, "3.1") is None  # an empty section is no entry
    readme = "Intro 1.5 words\n\nChangelog\n---------\n\n- 1.5 Fix it\n"
    root = _tree(tmp_path / "sdist", {"README.rst": readme})
    assert find_entry(root, "1.5") == ("README.rst", "Fix it")
    (root / "CHANGES.rst").write_text("1.5\n---\n\n- From CHANGES.\n")
    assert find_entry(root, "1.5") == ("CHANGES.rst", "- From CHANGES.")
    assert find_entry(root, "9.9") is None


def test_release_issue_names_the_checks_never_the_fix():
    f2p = ["tests/test_core.py::test_add"]
    with_notes = write_release_issue(
        "tinypkg",
        "1.0",
        "1.1",
        f2p,
        entry=("CHANGELOG.md", "- Fixed `add`."),
        messages={f2p[0]: "assert -1 == 3"},
        pass_to_pass_count=1,
        test_files=["tests/test_core.py"],
    )
    assert "- Fixed `add`." in with_notes and "`tests/test_core.py::test_add`" in with_notes
    assert "assert -1 == 3" not in with_notes  # release notes given: no failure excerpts
    from_tests = write_release_issue(
        "tinypkg",
        "1.0",
        "1.1",
        f2p,
        entry=None,
        messages={f2p[0]: "assert -1 == 3"},
        pass_to_pass_count=1,
        test_files=["tests/test_core.py"],
    )
    assert "assert -1 == 3" in from_tests and "Release notes" not in from_tests
    assert "a + b" not in from_tests and "a - b" not in from_tests


def test_pypi_release_list_and_consecutive_pairs():
    def files(*kinds, yanked=False):
        return [
            {
                "packagetype": k,
                "filename": f"x.{k}",
                "url": f"../../packages/x.{k}",
                "yanked": yanked,
                "digests": {"sha256": "ab"},
            }
            for k in kinds
        ]

    data = {
        "releases": {
            "1.10.0": files("sdist"),
            "1.9": files("sdist", "bdist_wheel"),
            "1.2": files("sdist"),
            "2.0rc1": files("sdist"),
            "1.11": files("bdist_wheel"),
            "1.12": files("sdist", yanked=True),
            "1.3.post1": files("sdist"),
        }
    }
    releases = releases_from_json("x", data, base_url="https://pypi.org/pypi/x/json")
    assert [r.version for r in releases] == ["1.2", "1.9", "1.10.0"]
    assert releases[0].url == "https://pypi.org/packages/x.sdist"  # relative to the JSON's URL
    assert version_key("1.2.0") == version_key("1.2") and version_key("2.0rc1") is None
    assert [(a.version, b.version) for a, b in consecutive_pairs(releases, pairs=1)] == [("1.9", "1.10.0")]
    assert len(consecutive_pairs(releases, pairs=5)) == 2
    named = consecutive_pairs(releases, pairs=1, versions=["1.10.0", "1.2"])
    assert [(a.version, b.version) for a, b in named] == [("1.2", "1.10.0")]
    with pytest.raises(ReleaseIndexError, match=r"no final release with an sdist for \['1.11'\]"):
        consecutive_pairs(releases, pairs=1, versions=["1.9", "1.11"])


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/pypi/parse/json", timeout=10):
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path(DEBIAN_PYTHON).is_file(), reason=f"needs Debian's {DEBIAN_PYTHON}")
def test_build_a_real_fix_from_pypi(tmp_path):
    """parse 1.22.3 fixed strftime time-only results dropping their timezone (`dt.time()` -> `dt.timetz()`)
    and added tests for it: the pair becomes a task with those tests as FAIL_TO_PASS, the release's
    changelog line as the issue, and the checks pass (oracle 1.0, untouched 0.0, edited tests 0.0)."""
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable")
    from arl.harbor.swe.export_rows import task_row
    from arl.harbor.swe.releases import build_releases

    out = tmp_path / "set"
    summary = build_releases(
        ["parse"], out, tmp_path / "cache", versions=["1.22.2", "1.22.3"], log=lambda _msg: None
    )
    [stats] = summary["packages"]
    figures = (stats["pairs_tried"], stats["reviewable"], stats["with_fail_to_pass"], stats["kept"])
    assert figures == (1, 1, 1, 1)
    task = out / "parse__1.22.2_to_1.22.3"
    config = json.loads((task / "tests" / "config.json").read_text())
    assert config["fail_to_pass"] == [
        f"tests/test_parse.py::test_flexible_time_preserves_timezone[{o}]"
        for o in ("+0000", "+00:00", "+0530", "-0430")
    ]
    assert "tests/test_parse.py::test_flexible_time_without_timezone_stays_naive" in config["pass_to_pass"]
    assert config["new_version"] == "1.22.3" and config["issue_source"] == "changelog"
    fix = (task / "solution" / "fix.patch").read_text()
    assert "+        return dt.timetz()" in fix and "tests/" not in fix
    assert "test_flexible_time_preserves_timezone" in (task / "tests" / "test.patch").read_text()
    # The agent's testbed is the old release, without the new tests.
    testbed = task / "environment" / "testbed"
    assert "return dt.time()" in (testbed / "parse" / "__init__.py").read_text()
    assert "preserves_timezone" not in (testbed / "tests" / "test_parse.py").read_text()
    instruction = (task / "instruction.md").read_text()
    assert "Preserve timezone offsets in strftime time-only results" in instruction
    assert "timetz" not in instruction
    row = json.loads((out / "manifest.jsonl").read_text())
    assert row["operator"] == "release" and row["version"] == "1.22.2" and row["new_version"] == "1.22.3"
    # Exported as a SWE-bench row, the new tests are its test_patch.
    exported = task_row(task, "hb__parse")
    assert exported["test_patch"] == (task / "tests" / "test.patch").read_text() and exported["patch"] == fix


def test_package_spec_of_pinned_and_unpinned_packages(tmp_path):
    from arl.harbor.swe.releases import build_releases, package_spec

    cov = _tree(
        tmp_path / "cov",
        {"src/covpkg/__init__.py": "", "setup.cfg": "[tool:pytest]\naddopts = --cov=covpkg\n"},
    )
    spec = package_spec("covpkg", "2.0", cov)
    assert (spec.src_root, spec.pytest_args, spec.test_deps) == ("src", ("-o", "addopts="), ())
    plain = _tree(
        tmp_path / "plain", {"plainpkg/__init__.py": "", "setup.cfg": "[tool:pytest]\naddopts = -q\n"}
    )
    assert package_spec("plainpkg", "1", plain, test_deps=("freezegun==1.5.5",)).pytest_args == ()
    pinned = package_spec("humanize", "4.16.0", _tree(tmp_path / "hz", {"src/humanize/__init__.py": ""}))
    assert pinned.test_deps == ("freezegun==1.5.5",)
    assert pinned.skip_test_files == ("tests/test_benchmarks.py",)
    assert pinned.version == "4.16.0" and pinned.src_root == "src"
    with pytest.raises(ValueError, match="one package"):
        build_releases(["a", "b"], tmp_path / "out", tmp_path / "cache", versions=["1", "2"])
    with pytest.raises(ValueError, match="at least two releases"):
        build_releases(["a"], tmp_path / "out", tmp_path / "cache", versions=["1"])
    with pytest.raises(ValueError, match="iniconfig is one of pytest's own dependencies"):
        build_releases(["iniconfig"], tmp_path / "out", tmp_path / "cache")
    with pytest.raises(ValueError, match="not a PyPI package name"):
        build_releases(["../etc"], tmp_path / "out", tmp_path / "cache")
