"""Package specs from the user: `--package NAME==VERSION` with its options, a TOML specs file, and the errors
that name the bad field."""

from __future__ import annotations

import pytest

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe.__main__ import build_specs, main, make_parser
from arl.harbor.swe.packages import PACKAGES, PackageSpec
from arl.harbor.swe.specs import check_unique, load_specs_file, parse_pin, spec_from_pin


def _specs(*argv: str) -> list[PackageSpec]:
    return build_specs(make_parser().parse_args(["build", "--out", "set", *argv]))


def test_pins_and_their_options():
    specs = _specs(
        "--package",
        "humanize==4.17.0",
        "--src-root",
        "src",
        "--test-deps",
        "freezegun==1.5.5",
        "tzdata",
        "--skip-test-files",
        "tests/test_benchmarks.py",
        "--package",
        "parse==1.22.4",
        "--pytest-args=-o addopts= -k 'not slow'",
    )
    assert specs == [
        PackageSpec(
            "humanize",
            "4.17.0",
            src_root="src",
            test_deps=("freezegun==1.5.5", "tzdata"),
            skip_test_files=("tests/test_benchmarks.py",),
        ),
        PackageSpec("parse", "1.22.4", pytest_args=("-o", "addopts=", "-k", "not slow")),
    ]
    assert _specs() == list(PACKAGES)  # nothing named: the pinned list
    assert [s.name for s in _specs("--packages", "six,toolz", "--package", "h11==0.16.0")] == [
        "six",
        "toolz",
        "h11",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--src-root", "src"], "--src-root applies to a --package NAME==VERSION given before it"),
        (
            ["--package", "h11==1", "--src-root", "a", "--src-root", "b"],
            "--src-root given twice for --package h11==1",
        ),
        (["--package", "h11"], "expected NAME==VERSION"),
        (["--package", "h11>=0.16"], "expected NAME==VERSION"),
        (["--package", "h11==0.16.*"], "version must be one released version"),
        (["--package", "h 11==0.16.0"], "name must be a PyPI project name"),
        (
            ["--package", "h11==0.16.0", "--src-root", "../up"],
            "src_root '../up' must be a folder inside the sdist",
        ),
        (["--package", "h11==0.16.0", "--pytest-args=--rootdir=/"], "pytest_args may not set '--rootdir=/'"),
        (["--package", "h11==0.16.0", "--pytest-args=-c x.ini"], "pytest_args may not set '-c'"),
        (["--package", "h11==0.16.0", "--skip-test-files", "/etc/x.py"], "skip_test_files entry '/etc/x.py'"),
        (
            ["--packages", "six", "--package", "six==1.16.0"],
            "package six is given twice (six-1.17.0 and six-1.16.0)",
        ),
        (["--packages", "nosuch"], "unknown package(s) ['nosuch']"),
    ],
)
def test_bad_command_lines_name_what_is_wrong(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--out", str(tmp_path / "set"), *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_specs_file(tmp_path):
    path = tmp_path / "specs.toml"
    path.write_text("""
[[package]]
name = "humanize"
version = "4.17.0"
src_root = "src"
test_deps = ["freezegun==1.5.5"]
skip_test_files = ["tests/test_benchmarks.py"]

[[package]]
name = "parse"
version = "1.22.4"
pytest_args = ["-o", "addopts="]
""")
    specs = load_specs_file(path)
    assert specs == [
        PackageSpec(
            "humanize",
            "4.17.0",
            src_root="src",
            test_deps=("freezegun==1.5.5",),
            skip_test_files=("tests/test_benchmarks.py",),
        ),
        PackageSpec("parse", "1.22.4", pytest_args=("-o", "addopts=")),
    ]
    # On the command line, with more packages after it.
    assert [s.key for s in _specs("--packages-file", str(path), "--package", "h11==0.16.0")] == [
        "h11-0.16.0",
        "humanize-4.17.0",
        "parse-1.22.4",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[[package]]\nname = "h11"\nversion = "0.16.0"\nsrcroot = "src"\n',
            "package[0] (h11): Object contains unknown field `srcroot`",
        ),
        (
            (
                '[[package]]\nname = "h11"\nversion = "0.16.0"\n[[package]]\nname = "six"\nversion = "1.17.0"\n'
                'test_deps = "pytz"\n'
            ),
            "package[1] (six): Expected `array`, got `str` - at `test_deps`",
        ),
        ('[[package]]\nname = "h11"\n', "package[0] (h11): Object missing required field `version`"),
        (
            '[[package]]\nname = "h11"\nversion = "0.16"\npytest_args = ["-c", "x"]\n',
            "package[0]: package spec 'h11' '0.16': pytest_args may not set '-c'",
        ),
        ("packages = []\n", "unknown field `packages`"),
        ("package = []\n", "no [[package]] table"),
        ("[[package]\n", "not valid TOML"),
    ],
)
def test_bad_specs_files_name_the_table_and_field(tmp_path, text, message):
    path = tmp_path / "specs.toml"
    path.write_text(text)
    with pytest.raises(HarborConfigError) as err:
        load_specs_file(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_pins_and_spec_fields():
    assert parse_pin(" python-dateutil==2.9.0.post0 ") == ("python-dateutil", "2.9.0.post0")
    assert spec_from_pin("zope.interface==7.2", src_root="src").key == "zope.interface-7.2"
    with pytest.raises(HarborConfigError, match="test_deps must be a tuple of non-empty strings"):
        PackageSpec("h11", "0.16.0", test_deps=["pytz"])  # a list: the spec is frozen and hashable
    with pytest.raises(HarborConfigError, match="given twice"):
        check_unique([PackageSpec("Python_Slugify", "9.2.0"), PackageSpec("python-slugify", "9.1.0")])
