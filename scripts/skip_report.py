"""Which tests a pytest run skipped and why, read from the JUnit XML it wrote (`--junitxml`, xunit1).

scripts/test.py has every part write one and prints the skips in its summary, so a run that passed
also says what it did not test (no GPU, no docker daemon, no tmux, ...). Expected failures (xfail) are
not skips and are left out.
"""

from __future__ import annotations

import ast
import textwrap
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

#: pytest options that make a run write what `read_skips` reads (xunit1 keeps each test's file).
JUNIT_FAMILY = ["-o", "junit_family=xunit1"]


@dataclass(frozen=True)
class Skip:
    """One skipped test (or module, when it was skipped at collection) and the reason it gave."""

    test: str  # pytest's node id, e.g. "packages/arl-sync/tests/test_gpu.py::test_nccl[2]"
    reason: str


def junit_args(path: Path) -> list[str]:
    """The pytest arguments that write the run's JUnit XML to `path`."""
    return [f"--junitxml={path}", *JUNIT_FAMILY]


def _node_id(case: ET.Element) -> str:
    """The node id of a <testcase>: its file, the class (if any) left in `classname`, its name."""
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    if not file:
        return f"{classname}::{name}" if classname else name
    dotted = file.removesuffix(".py").replace("/", ".")
    if not classname and name == dotted:
        return file  # a module skipped at collection: pytest names it after the file
    inner = classname[len(dotted) + 1 :].split(".") if classname.startswith(dotted + ".") else []
    return "::".join([file, *inner, name])


def read_skips(path: Path) -> list[Skip] | None:
    """The skips of the run that wrote `path`, in its order; None when there is no readable report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    skips = []
    for case in root.iter("testcase"):
        for skipped in case.findall("skipped"):
            if skipped.get("type") == "pytest.xfail":
                continue
            skips.append(Skip(_node_id(case), _reason(skipped)))
    return skips


def _reason(skipped: ET.Element) -> str:
    """A skip's reason. A module skipped at collection has the message "collection skipped" and the
    report's (file, line, "Skipped: reason") tuple as its text."""
    message, text = skipped.get("message") or "", (skipped.text or "").strip()
    if message == "collection skipped":
        try:
            _file, _line, reason = ast.literal_eval(text)
            return str(reason).removeprefix("Skipped: ")
        except (ValueError, SyntaxError, TypeError):
            return text or message
    return message or text


def format_skips(skips_by_part: dict[str, list[Skip] | None], width: int = 110) -> list[str]:
    """Summary lines: per part, each reason once with how many tests and which; a part without a
    report says so."""
    lines: list[str] = []
    for part, skips in skips_by_part.items():
        if skips is None:
            lines.append(f"{part}: no report of its skips (pytest did not write its JUnit XML)")
            continue
        by_reason: dict[str, list[str]] = defaultdict(list)
        for skip in skips:
            by_reason[skip.reason].append(skip.test)
        for reason, tests in by_reason.items():
            lines.append(f"{part}: {len(tests)} skipped: {reason}")
            lines += textwrap.wrap(
                ", ".join(tests),
                width=width,
                initial_indent="    ",
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
    return lines
