"""Every relative link in the repository's Markdown files points at a file or folder that exists.

Checks `[text](target)` and `![alt](target)` links in every `*.md` file tracked or not ignored in the
checkout (environments, caches and build outputs left out), skipping links with a scheme
(`https:`, `mailto:`), pure anchors (`#section`) and anything inside code spans or fenced code
blocks. A target is resolved against the Markdown file's folder (a leading `/` against the
repository root); its `#anchor` is not checked. No network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {
    ".git",
    ".venv",
    ".venvs",
    ".cache",
    ".pytest_cache",
    ".ruff_cache",
    ".device-stage",
    "node_modules",
    "runs",
    "dist",
    "__pycache__",
}
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def markdown_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(REPO_ROOT):
        # Pruned, not walked and filtered: the environments and caches hold ~90k files (seconds per walk).
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every relative link outside code."""
    links = []
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1)
            if SCHEME.match(target) or target.startswith("#"):
                continue
            links.append((number, target))
    return links


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in relative_links(path.read_text(encoding="utf-8")):
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        if not file_part:
            continue
        base = REPO_ROOT if file_part.startswith("/") else path.parent
        if not (base / file_part.lstrip("/")).exists():
            problems.append(f"{path.relative_to(REPO_ROOT)}:{number}: {target}")
    return problems


def test_the_link_finder_skips_code_and_urls():
    text = "\n".join(
        [
            "[a](docs/x.md) and ![img](pic.png#frag) and [web](https://example.com) [anchor](#top)",
            '`[not](in/code.md)` [b](<spaced/path.md>) [c](y.md "title")',
            "```",
            "[fenced](nope.md)",
            "```",
        ]
    )
    assert [t for _, t in relative_links(text)] == ["docs/x.md", "pic.png#frag", "spaced/path.md", "y.md"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_links_resolve(path: Path):
    assert broken_links(path) == [], (
        "links to nothing (fix the path, or write it as `code` if it is not a link)"
    )
