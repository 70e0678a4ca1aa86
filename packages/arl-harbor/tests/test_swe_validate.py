"""FAIL_TO_PASS / PASS_TO_PASS classification on a tiny local package (no network): the baseline, the
module → test-file map, a real bug, a harmless change and a hanging one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from arl.harbor.swe.runner import PytestRun, run_pytest
from arl.harbor.swe.testing import write_tiny_package
from arl.harbor.swe.validate import (
    Baseline,
    classify,
    is_test_path,
    mapped_test_files,
    module_token,
    source_modules,
)

PYTHON = Path(sys.executable)  # this environment has pytest, like a package's test venv


@pytest.fixture
def tiny(tmp_path):
    root = tmp_path / "tinycalc-0.0.1"
    return root, write_tiny_package(root)


def test_paths_modules_and_test_map(tiny):
    root, spec = tiny
    assert (
        is_test_path("tests/test_x.py") and is_test_path("pkg/tests/helpers.py") and is_test_path("x_test.py")
    )
    assert not is_test_path("pkg/core.py") and not is_test_path("README.rst")
    assert source_modules(root, spec) == ["tinycalc/__init__.py"]
    assert module_token("tinycalc/__init__.py", spec) == "tinycalc"
    assert mapped_test_files("tinycalc/__init__.py", spec, root, ["tests/test_tinycalc.py"]) == [
        "tests/test_tinycalc.py"
    ]


def test_baseline_and_a_real_bug(tiny):
    root, spec = tiny
    baseline = Baseline(root, PYTHON, spec)
    assert baseline.discover() == ["tests/test_tinycalc.py"]
    passed, seconds = baseline.passed(["tests/test_tinycalc.py"])
    assert len(passed) == 12 and seconds > 0
    assert "tests/test_tinycalc.py::test_digits[1234-expected2]" in passed

    module = root / "tinycalc" / "__init__.py"
    module.write_text(module.read_text().replace("n = n // 10", "n = n // 100"))
    run = run_pytest(root, PYTHON, files=["tests/test_tinycalc.py"])
    result = classify(passed, run)
    assert result.kept
    assert result.fail_to_pass == [
        "tests/test_tinycalc.py::test_digits[-56-expected3]",
        "tests/test_tinycalc.py::test_digits[1234-expected2]",
    ]
    assert len(result.pass_to_pass) == 10 and not set(result.fail_to_pass) & set(result.pass_to_pass)
    assert "assert" in run.messages[result.fail_to_pass[0]]


def test_rejects_harmless_total_and_hanging_changes(tiny):
    root, spec = tiny
    passed, _ = Baseline(root, PYTHON, spec).passed(["tests/test_tinycalc.py"])
    module = root / "tinycalc" / "__init__.py"
    source = module.read_text()

    module.write_text(source.replace('raise ValueError("negative")', 'raise ValueError("below zero")'))
    assert (
        classify(passed, run_pytest(root, PYTHON, files=["tests/test_tinycalc.py"])).reject == "no test fails"
    )

    module.write_text(
        source.replace('"""tinycalc: a few small functions with tests."""', "import no_such_module")
    )
    assert (
        classify(passed, run_pytest(root, PYTHON, files=["tests/test_tinycalc.py"])).reject
        == "every test fails"
    )

    module.write_text(source.replace("    if lo > hi:", "    while True:\n        pass\n    if lo > hi:"))
    run = run_pytest(root, PYTHON, files=["tests/test_tinycalc.py"], timeout_sec=5)
    assert run.timed_out and classify(passed, run).reject == "timeout"


FLAKY_TEST = """
import os
from pathlib import Path


def test_fails_on_every_third_run():
    # A test whose outcome depends on the run, like a socket test under load: each run appends a byte to a
    # shared file and fails when it was the third.
    tally = Path(__file__).with_name("tally")
    fd = os.open(tally, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"x")
    os.close(fd)
    assert tally.stat().st_size % 3 != 0
"""


def test_baseline_leaves_out_a_flaky_test(tiny):
    root, spec = tiny
    (root / "tests" / "test_flaky.py").write_text(FLAKY_TEST)
    baseline = Baseline(root, PYTHON, spec, runs=3)
    assert baseline.discover() == ["tests/test_tinycalc.py"]  # the flaky file has no test that always passes
    assert baseline.flaky == {"tests/test_flaky.py::test_fails_on_every_third_run"}
    passed, _ = baseline.passed(["tests/test_tinycalc.py", "tests/test_flaky.py"])
    assert len(passed) == 12 and not any("flaky" in t for t in passed)
    with pytest.raises(ValueError, match="at least 2"):
        Baseline(root, PYTHON, spec, runs=1)


def test_classify_without_report():
    assert classify({"t::a"}, PytestRun(exitstatus=None)).reject.startswith("no report")
