"""The task's instruction: an issue written from the failing tests' output (no model involved).

It says which tests fail, shows the first failures' assertion/traceback excerpts (as pytest printed
them) and states the expected behaviour. It never names the mutation, the operator or the fix; the
function is not named either, only what the tests show.
"""

from __future__ import annotations

import re
from pathlib import Path

# Where the task image keeps what the builder's venv holds: Debian's python3 with pytest and the test deps
# installed system-wide by pip (arl-swe-base's build, the task Dockerfile's RUN step).
IMAGE_SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
_MAX_FAILING_LISTED = 10
_MAX_EXCERPTS = 2
_MAX_EXCERPT_LINES = 30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _excerpt(text: str) -> str:
    """The tail of a pytest failure text: the test's lines and the error, trimmed."""
    lines = [ln.rstrip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    if len(lines) > _MAX_EXCERPT_LINES:
        lines = ["..."] + lines[-_MAX_EXCERPT_LINES:]
    return "\n".join(lines)


def task_paths(text: str, *, testbed: Path, venv: Path) -> str:
    """`text` (pytest's output on the builder's host) with the host's paths as the task sees them: the
    worker's copy of the source as /testbed, the builder's venv as the image's interpreter and site dir."""
    replacements: dict[str, str] = {}
    for path in {venv, venv.resolve()}:
        for site in sorted(path.glob("lib/python3*/site-packages")):
            replacements[str(site)] = IMAGE_SITE_PACKAGES
        replacements[str(path / "bin")] = "/usr/bin"
        replacements[str(path)] = "/usr"
    for path in {testbed, testbed.resolve()}:
        replacements[str(path)] = "/testbed"
    for host in sorted(replacements, key=len, reverse=True):  # the longest first: site-packages before venv
        text = text.replace(host, replacements[host])
    return text


def write_issue(
    package: str, version: str, fail_to_pass: list[str], messages: dict[str, str], pass_to_pass_count: int
) -> str:
    """The instruction.md text for a bug that makes `fail_to_pass` fail (messages by node id)."""
    files = sorted({t.split("::", 1)[0] for t in fail_to_pass})
    n = len(fail_to_pass)
    lines = [
        f"# {package} {version}: {n} test{'s' if n != 1 else ''} of the package's own suite now fail"
        f"{'s' if n == 1 else ''}",
        "",
        f"The source of `{package}` is checked out at `/testbed` (a git repository). Since the last change, "
        f"some of the package's own tests in {', '.join(f'`{f}`' for f in files)} fail. "
        "They passed before and they describe the intended behaviour.",
        "",
        "## Failing tests",
        "",
    ]
    lines += [f"- `{t}`" for t in fail_to_pass[:_MAX_FAILING_LISTED]]
    if n > _MAX_FAILING_LISTED:
        lines.append(f"- … and {n - _MAX_FAILING_LISTED} more in the same files")
    shown = [t for t in fail_to_pass if messages.get(t)][:_MAX_EXCERPTS]
    if shown:
        lines += ["", "## What pytest reports", ""]
        for t in shown:
            lines += [f"`{t}`:", "", "```", _excerpt(messages[t]), "```", ""]
    lines += [
        "## Expected behaviour",
        "",
        "Fix the package's source so that these tests pass again, and keep the rest of the suite passing "
        f"({pass_to_pass_count} other tests in the same files pass now and must still pass). Do not edit the "
        "tests: they are restored before grading. Run them with `python3 -m pytest "
        f"{' '.join(files)}` from `/testbed`.",
        "",
    ]
    return "\n".join(lines)
