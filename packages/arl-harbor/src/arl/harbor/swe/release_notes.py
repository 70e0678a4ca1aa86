"""The issue text of a release task: the release's changelog entry, else what its new tests report.

A changelog is looked for in the new release's sdist: a CHANGELOG / CHANGES / HISTORY / NEWS file at the
top or under docs/, else the "Changelog" (or "History", "Changes", "Release notes") part of its README.
Two entry styles are read: a heading naming the version (`## 1.2.3`, `v1.2.3 (date)` over a `===` line,
`1.2.3` over `---`), whose section runs to the next heading of a version; and a list item starting with
the version (`- 1.2.3 Fix ...`), with its indented continuation lines. Without one, the issue is written
from the new tests that fail on the old source: their ids and pytest's first failure excerpts (the
tests' own lines and errors, never the source diff).
"""

from __future__ import annotations

import re
from pathlib import Path

from arl.harbor.swe.issue import _excerpt

_NOTES_STEMS = ("changelog", "changes", "history", "news", "releases", "release_notes", "release-notes")
_README_PART = re.compile(
    r"^\W*(change\s*log|changes|history|release\s+notes|version\s+history)\W*$", re.IGNORECASE
)
_UNDERLINE = re.compile(r"^\s*([=\-~^+*#`'\"])\1{2,}\s*$")
_ANY_VERSION_HEAD = re.compile(r"^(?:#+\s*)?\[?(?:v|version\s+|release\s+)?\d+\.\d+", re.IGNORECASE)
MAX_ENTRY_LINES = 60
_MAX_FAILING_LISTED = 10
_MAX_EXCERPTS = 2


def notes_files(root: Path) -> list[Path]:
    """The changelog-like files of an unpacked sdist, most specific first; READMEs last."""
    found = []
    for folder in (root, root / "docs", root / "doc"):
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            stem = path.name.lower().split(".", 1)[0]
            if path.is_file() and stem in _NOTES_STEMS:
                found.append(path)
    found += sorted(p for p in root.iterdir() if p.is_file() and p.name.lower().startswith("readme"))
    return found


def _version_line(version: str) -> re.Pattern[str]:
    v = re.escape(version)
    return re.compile(
        rf"^(?P<indent>\s*)(?P<item>[-*+]\s+)?(?:#+\s*)?(?:\*\*)?\[?"
        rf"(?:v|version\s+|release\s+)?{v}"
        rf"(?![\w.])(?P<rest>.*)$",
        re.IGNORECASE,
    )


def entry_in_text(text: str, version: str) -> str | None:
    """The entry for `version` in a changelog's text (None: no entry, or an empty one)."""
    lines = text.splitlines()
    pattern = _version_line(version)
    for i, line in enumerate(lines):
        m = pattern.match(line)
        if not m:
            continue
        if m.group("item"):  # "- 1.2.3 Fixed ..." and its indented continuation
            rest = re.sub(r"^[\s*:)\]-]+", "", m.group("rest"))
            body = [rest]
            width = len(m.group("indent")) + len(m.group("item"))
            for nxt in lines[i + 1 :]:
                if not nxt.strip() or len(nxt) - len(nxt.lstrip()) < width:
                    break
                body.append(nxt.strip())
        else:  # a heading: up to the next heading of a version
            body = []
            for nxt in lines[i + 1 :]:
                if _ANY_VERSION_HEAD.match(nxt):
                    break
                body.append(nxt)
            # The heading's own rst underline, and section rules, are not the entry's text.
            body = [ln for ln in body if not _UNDERLINE.match(ln)]
        while body and not body[0].strip():
            body.pop(0)
        while body and not body[-1].strip():
            body.pop()
        if not any(re.search(r"[A-Za-z]{3}", ln) for ln in body):
            continue  # a version in a table of contents or an empty section: look further
        if len(body) > MAX_ENTRY_LINES:
            body = body[:MAX_ENTRY_LINES] + ["…"]
        return "\n".join(body)
    return None


def _readme_notes(text: str) -> str:
    """The part of a README after its changelog heading ("" when it has none)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _README_PART.match(line.strip()):
            return "\n".join(lines[i + 1 :])
    return ""


def find_entry(root: Path, version: str) -> tuple[str, str] | None:
    """(file relative to `root`, entry text) of `version`'s changelog entry in the sdist at `root`."""
    for path in notes_files(root):
        text = path.read_text(errors="replace")
        if path.name.lower().startswith("readme"):
            text = _readme_notes(text)
        entry = entry_in_text(text, version)
        if entry:
            return path.relative_to(root).as_posix(), entry
    return None


def write_release_issue(
    package: str,
    old: str,
    new: str,
    fail_to_pass: list[str],
    *,
    entry: tuple[str, str] | None,
    messages: dict[str, str],
    pass_to_pass_count: int,
    test_files: list[str],
) -> str:
    """The instruction.md of a release task: the changelog entry (or the failures) and what is checked."""
    n = len(fail_to_pass)
    how = (
        ", as its release notes below describe."
        if entry
        else "; its release notes are not at hand, so they are known here only from the tests that check them."
    )
    intro = (
        f"The source of `{package}` {old} is checked out at `/testbed` (a git repository). Make the "
        f"source changes that `{package}` {new} made{how}"
    )
    lines = [f"# {package}: the changes of release {new}", "", intro, ""]
    if entry:
        lines += [f"## Release notes of {new} (from `{entry[0]}`)", "", entry[1], ""]
    checked = (
        f"The tests of {new} are applied over your change when it is graded; they are not in "
        f"`/testbed` now. {n} test{'s' if n != 1 else ''} of them fail{'s' if n == 1 else ''} on the "
        "source as it is and must pass:"
    )
    lines += ["## How it is checked", "", checked, ""]
    lines += [f"- `{t}`" for t in fail_to_pass[:_MAX_FAILING_LISTED]]
    if n > _MAX_FAILING_LISTED:
        lines.append(f"- … and {n - _MAX_FAILING_LISTED} more")
    lines.append("")
    shown = [t for t in fail_to_pass if messages.get(t)][:_MAX_EXCERPTS] if not entry else []
    if shown:
        lines += ["## What pytest reports for them now", ""]
        for t in shown:
            lines += [f"`{t}`:", "", "```", _excerpt(messages[t]), "```", ""]
    files = ", ".join(f"`{f}`" for f in test_files)
    lines += [
        (
            f"{pass_to_pass_count} other tests in {files} pass now and must still pass. Do not edit the "
            "tests: test files are restored before grading."
        ),
        "",
    ]
    return "\n".join(lines)
