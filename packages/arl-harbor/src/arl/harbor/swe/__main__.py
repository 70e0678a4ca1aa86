"""Command line: `python -m arl.harbor.swe {build,releases,verify,images,convert,export}`.

build  --out <set> [--packages a,b] [--max-per-package N] [--max-candidates N] [--jobs N] [--seed S]
       [--cache .cache/swe] [--python /usr/bin/python3.11] [--max-suite-seconds S]
       [--package NAME==VERSION [--src-root DIR] [--test-deps REQ ...] [--pytest-args=ARGS]
        [--skip-test-files PATH ...]] ...  [--packages-file specs.toml]
       (any PyPI package; each option after a --package applies to it; arl.harbor.swe.specs)
releases --out <set> (--package NAME ... | --pinned) [--pairs N] [--versions A,B,...]
       (tasks from real fixes between consecutive PyPI releases; arl.harbor.swe.release_cli)
verify <set> [--ids a,b] [--jobs N]     (exit 1 when a task fails a check)
regrade <set>                           (rewrite the tasks' grader with this version's; arl.harbor.swe.regrade)
images <set> [--force] [--network none] [--timeout S]   (docker: every task's image built once,
       recorded in manifest.jsonl; arl.harbor.swe.images)
convert <rows.jsonl|.json|.parquet|import.toml> --out <dir> [--image-template T] [--python P]
       [--test-cmd CMD | --test-cmd OWNER/REPO=CMD ...] [--skip-invalid]
       (SWE-bench-format rows → Harbor task dirs; arl.harbor.swe.import_rows)
export <set> --out rows.jsonl [--style swe-bench|swe-gym] [--build] [--images-dir DIR]
       (a built set → SWE-bench-format rows + images; arl.harbor.swe.export_rows)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe import release_cli
from arl.harbor.swe.build import MAX_SUITE_SECONDS, build
from arl.harbor.swe.packages import PackageSpec, select
from arl.harbor.swe.regrade import regrade_set
from arl.harbor.swe.specs import check_unique, load_specs_file, spec_from_pin
from arl.harbor.swe.venvs import DEBIAN_PYTHON
from arl.harbor.swe.verify import verify_set
from arl.harbor.swe.writer import GRADING


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


class _Pin(argparse.Action):
    """`--package NAME==VERSION`: starts a new package; the spec options after it fill its fields."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001 - argparse's signature
        pins = list(getattr(namespace, "pins", None) or [])
        pins.append({"pin": values})
        namespace.pins = pins


class _PinOption(argparse.Action):
    """`--src-root` / `--test-deps` / `--pytest-args` / `--skip-test-files`: a field of the last --package."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001 - argparse's signature
        pins = getattr(namespace, "pins", None)
        if not pins:
            parser.error(f"{option_string} applies to a --package NAME==VERSION given before it")
        if self.dest in pins[-1]:
            parser.error(f"{option_string} given twice for --package {pins[-1]['pin']}")
        if self.dest == "pytest_args":  # one string, so that arguments starting with "-" pass argparse
            try:
                values = shlex.split(values)
            except ValueError as e:
                parser.error(f"{option_string} {values!r}: {e}")
        pins[-1][self.dest] = values if isinstance(values, str) else tuple(values)


def build_specs(args: argparse.Namespace) -> list[PackageSpec]:
    """The packages to build: --packages (pinned names), each --package, the --packages-file's tables."""
    specs = select(_csv(args.packages)) if args.packages else []
    for pin in args.pins or []:
        fields = {k: v for k, v in pin.items() if k != "pin"}
        specs.append(spec_from_pin(pin["pin"], **fields))
    if args.packages_file is not None:
        specs += load_specs_file(args.packages_file)
    return check_unique(specs or select(None))


def make_parser() -> argparse.ArgumentParser:
    """The command line's parser (`images` has its own: arl.harbor.swe.images)."""
    parser = argparse.ArgumentParser(
        prog="python -m arl.harbor.swe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a task set from the pinned packages' sdists")
    b.add_argument("--out", required=True, type=Path, help="the task set folder (created)")
    b.add_argument(
        "--packages",
        help="comma-separated names of pinned packages (packages.py); with none of "
        "--packages / --package / --packages-file: all pinned ones",
    )
    b.add_argument(
        "--package",
        action=_Pin,
        dest="pins",
        metavar="NAME==VERSION",
        help="any PyPI package's sdist (repeatable); the options below apply to the --package before them",
    )
    b.add_argument(
        "--src-root",
        action=_PinOption,
        dest="src_root",
        metavar="DIR",
        help="the sdist folder that goes on PYTHONPATH (default: .)",
    )
    b.add_argument(
        "--test-deps",
        action=_PinOption,
        dest="test_deps",
        nargs="+",
        metavar="REQ",
        help="extra requirements of its tests, installed from wheels (pytest is always there)",
    )
    b.add_argument(
        "--pytest-args",
        action=_PinOption,
        dest="pytest_args",
        metavar="ARGS",
        help="added to every pytest run, one shell-quoted string: --pytest-args='-o addopts='",
    )
    b.add_argument(
        "--skip-test-files",
        action=_PinOption,
        dest="skip_test_files",
        nargs="+",
        metavar="PATH",
        help="test files left out (relative to the sdist root)",
    )
    b.add_argument(
        "--packages-file",
        type=Path,
        metavar="TOML",
        help="[[package]] tables with name, version, src_root, test_deps, pytest_args, skip_test_files",
    )
    b.add_argument(
        "--max-suite-seconds",
        type=float,
        default=MAX_SUITE_SECONDS,
        help="a package whose whole suite, run once alone, takes longer is refused",
    )
    b.add_argument("--max-per-package", type=int, default=30, help="tasks per package, at most")
    b.add_argument("--max-candidates", type=int, default=600, help="triples looked at per package, at most")
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--baseline-runs",
        type=int,
        default=3,
        help="pristine test-suite runs side by side; a test that fails in any is left out as flaky",
    )
    b.add_argument("--cache", type=Path, default=Path(".cache/swe"))
    b.add_argument("--python", default=DEBIAN_PYTHON, help="the interpreter of the test venvs (Debian's)")
    release_cli.add_parser(sub)
    v = sub.add_parser("verify", help="check oracle / untouched / edited-tests rewards on the host")
    v.add_argument("set", type=Path)
    v.add_argument("--ids", help="comma-separated task ids (default: all)")
    v.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("regrade", help="rewrite a built or imported set's grader with this version's")
    r.add_argument("set", type=Path)
    sub.add_parser("images", help="build every task's docker image once (python -m arl.harbor.swe.images -h)")
    c = sub.add_parser("convert", help="SWE-bench-format rows -> Harbor task dirs graded like arl's own")
    c.add_argument("rows", help="a .jsonl/.json/.parquet rows file, or an import .toml (ImportOptions' keys)")
    c.add_argument(
        "--out", required=True, type=Path, help="the task folder (replaced when it is an earlier import)"
    )
    c.add_argument(
        "--image-template",
        help="image of rows naming none: swebench | swe-gym | a str.format template "
        "over {instance_id}, {swebench_key}, {openhands_key}, {repo}, ...",
    )
    c.add_argument("--python", help="the interpreter in the image that runs the tests (absolute)")
    c.add_argument(
        "--test-cmd",
        action="append",
        default=[],
        metavar="[OWNER/REPO=]CMD",
        help="the pytest command of rows without a test_cmd column (default: pytest), or of one repo",
    )
    c.add_argument(
        "--skip-invalid",
        action="store_true",
        help="import the valid rows; list the refused ones in <out>/refused.jsonl",
    )
    e = sub.add_parser("export", help="a built set -> SWE-bench-format rows (+ images)")
    e.add_argument("set", type=Path)
    e.add_argument("--out", required=True, type=Path, help="the rows file (.jsonl)")
    e.add_argument(
        "--style",
        choices=["swe-bench", "swe-gym"],
        default="swe-bench",
        help="SWE-bench Verified's shape (test lists JSON-encoded) or SWE-Gym's (lists)",
    )
    e.add_argument("--build", action="store_true", help="build each task's image in the local engine")
    e.add_argument("--images-dir", type=Path, help="build the images and docker save them to DIR/images.tar")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["images"]:  # its own parser: arl.harbor.swe.images
        from arl.harbor.swe.images import main as images_main

        return images_main(argv[1:])
    parser = make_parser()
    args = parser.parse_args(argv)

    if args.cmd in ("convert", "export"):
        return _rows_command(args)
    if args.cmd == "releases":
        return release_cli.run(args, argv, parser)
    if args.cmd == "regrade":
        try:
            rewritten = regrade_set(args.set)
        except HarborConfigError as e:
            parser.error(str(e))
        _log(f"{len(rewritten)} task(s) of {args.set} now graded as {GRADING}")
        return 0

    if args.cmd == "build":
        if args.max_per_package < 1 or args.jobs < 1:
            parser.error("--max-per-package and --jobs must be at least 1")
        if args.baseline_runs < 2:
            parser.error("--baseline-runs must be at least 2 (one run cannot tell a flaky test)")
        if args.max_suite_seconds <= 0:
            parser.error("--max-suite-seconds must be positive")
        try:
            specs = build_specs(args)
        except HarborConfigError as e:
            parser.error(str(e))
        if not Path(args.python).is_file():
            parser.error(f"--python {args.python} does not exist (Debian's python3.11 is expected)")
        command = "python -m arl.harbor.swe " + " ".join(shlex.quote(a) for a in argv)
        summary = build(
            specs,
            args.out.resolve(),
            args.cache.resolve(),
            max_per_package=args.max_per_package,
            max_candidates=args.max_candidates,
            jobs=args.jobs,
            seed=args.seed,
            python=args.python,
            baseline_runs=args.baseline_runs,
            max_suite_s=args.max_suite_seconds,
            command=command,
            log=_log,
        )
        for p in summary["packages"]:
            _log(
                f"{p['package']} {p['version']}: kept {p['kept']} of {p['candidates_run']} run "
                f"({p['considered']} considered) in {p['seconds']} s; {len(p['flaky_tests'])} flaky tests left out"
            )
        for r in summary["refused"]:
            _log(f"{r['package']} {r['version']}: refused ({r['kind']}): {r['reason']}")
        _log(
            f"{summary['tasks_in_set']} tasks in {args.out} ({summary['seconds']} s); "
            f"operators: {summary['operators_in_set']}"
        )
        # Exit 1 only when nothing could be built: a refusal among other packages is listed, not fatal.
        return 1 if summary["refused"] and not summary["packages"] else 0
    if not args.set.is_dir():
        parser.error(f"{args.set} is not a directory")
    try:
        checks = verify_set(args.set.resolve(), _csv(args.ids) or None, jobs=args.jobs, log=_log)
    except ValueError as e:
        parser.error(str(e))
    bad = [c for c in checks if not c.ok]
    _log(f"{len(checks) - len(bad)}/{len(checks)} tasks pass oracle=1.0, untouched=0.0, edited-tests!=1.0")
    return 1 if bad else 0


def _rows_command(args: argparse.Namespace) -> int:
    """`convert` / `export`: errors of the data are one line on stderr and exit 1."""
    from arl.harbor.errors import HarborConfigError

    try:
        if args.cmd == "convert":
            from arl.harbor.swe.import_rows import convert_rows, options_from_args

            rows, options = options_from_args(
                args.rows,
                image_template=args.image_template,
                python=args.python,
                test_cmds=args.test_cmd,
                skip_invalid=args.skip_invalid,
            )
            convert_rows(rows, args.out, options, log=_log)
        else:
            import asyncio

            from arl.harbor.swe.export_rows import export_set

            if not args.set.is_dir():
                raise HarborConfigError(f"{args.set} is not a directory")
            asyncio.run(
                export_set(
                    args.set,
                    args.out,
                    style=args.style,
                    build=args.build,
                    images_dir=args.images_dir,
                    log=_log,
                )
            )
    except HarborConfigError as e:
        _log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
