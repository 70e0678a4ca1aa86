"""`python -m arl.harbor.swe releases`: the release-history builder's command line (`releases.py`).

releases --out <set> (--package NAME ... | --pinned) [--pairs N] [--versions A,B,...] [--runs N]
         [--max-files N] [--max-lines N] [--test-deps REQ,..] [--no-check] [--cache .cache/swe]
         [--python /usr/bin/python3.11]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from arl.harbor.swe.packages import PACKAGES
from arl.harbor.swe.release_index import ReleaseIndexError
from arl.harbor.swe.releases import MAX_SOURCE_FILES, MAX_SOURCE_LINES, build_releases
from arl.harbor.swe.venvs import DEBIAN_PYTHON


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `releases` subcommand's parser, added to `sub`."""
    r = sub.add_parser("releases", help="build tasks from real fixes between consecutive PyPI releases")
    r.add_argument("--out", required=True, type=Path, help="the task set folder (created)")
    r.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="a PyPI package (repeatable; comma-separated names too)",
    )
    r.add_argument("--pinned", action="store_true", help="the pinned packages of packages.py as well")
    r.add_argument("--pairs", type=int, default=3, help="the last N consecutive release pairs of a package")
    r.add_argument("--versions", help="comma-separated releases of one --package: the pairs between them")
    r.add_argument("--runs", type=int, default=2, help="runs per tree side by side (flaky tests left out)")
    r.add_argument("--max-files", type=int, default=MAX_SOURCE_FILES, help="source files a fix may change")
    r.add_argument("--max-lines", type=int, default=MAX_SOURCE_LINES, help="source lines a fix may change")
    r.add_argument(
        "--test-deps",
        metavar="REQ[,REQ]",
        help="the tests' extra requirements (default: a pinned package's own, else none)",
    )
    r.add_argument(
        "--no-check",
        action="store_true",
        help="keep tasks without the oracle / untouched / edited-tests checks",
    )
    r.add_argument("--cache", type=Path, default=Path(".cache/swe"))
    r.add_argument("--python", default=DEBIAN_PYTHON, help="the interpreter of the test venvs (Debian's)")
    return r


def run(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> int:
    """Build the release tasks `args` ask for; bad arguments are a parser error, PyPI failures exit 1."""
    names = [n.strip() for p in args.package for n in p.split(",") if n.strip()]
    if args.pinned:
        names += [p.name for p in PACKAGES if p.name not in names]
    if not names:
        parser.error("releases: name a package (--package NAME) or --pinned")
    if args.pairs < 1 or args.runs < 1 or args.max_files < 1 or args.max_lines < 1:
        parser.error("releases: --pairs, --runs, --max-files and --max-lines must be at least 1")
    if not Path(args.python).is_file():
        parser.error(f"--python {args.python} does not exist (Debian's python3.11 is expected)")
    versions = [v.strip() for v in (args.versions or "").split(",") if v.strip()] or None
    test_deps = tuple(d.strip() for d in args.test_deps.split(",") if d.strip()) if args.test_deps else None
    command = "python -m arl.harbor.swe " + " ".join(shlex.quote(a) for a in argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        summary = build_releases(
            names,
            args.out.resolve(),
            args.cache.resolve(),
            pairs=args.pairs,
            versions=versions,
            python=args.python,
            runs=args.runs,
            max_files=args.max_files,
            max_lines=args.max_lines,
            test_deps=test_deps,
            check=not args.no_check,
            command=command,
            log=log,
        )
    except ValueError as e:
        parser.error(f"releases: {e}")
    except ReleaseIndexError as e:
        log(f"error: {e}")
        return 1
    for p in summary["packages"]:
        log(
            f"{p['package']}: {p['pairs_tried']} pairs, {p['source_and_tests']} with source + test changes, "
            f"{p['reviewable']} within the caps, {p['with_fail_to_pass']} with FAIL_TO_PASS, "
            f"{p['kept']} kept ({p['seconds']} s)"
        )
    log(f"{summary['tasks_built_now']} release tasks in {args.out} ({summary['seconds']} s)")
    return 0
