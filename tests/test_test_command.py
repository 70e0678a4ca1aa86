"""scripts/test.py, README's test command: its summary names the skipped tests and why, its lint part runs
ruff, it makes the project's Docker engine ready where it can, without failing where it cannot, and the
apps part starts beside the last package part (with two slots), not after it.

The skips come from a small fake part run by the script's own `run_part`; the Docker steps are fake
scripts in place of scripts/docker/ (the real ones install packages and start daemons).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

FAKE_TESTS = """
import pytest

@pytest.mark.skip(reason="needs a CUDA GPU")
def test_gpu():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    if n == 2:
        pytest.skip("no docker daemon answers")

class TestBox:
    def test_inner(self):
        pytest.skip("needs a CUDA GPU")

@pytest.mark.xfail(reason="an expected failure is not a skip")
def test_expected_failure():
    assert False
"""


@pytest.fixture
def scripts(monkeypatch):
    """scripts/test.py and its helper modules, imported as `uv run scripts/test.py` finds them."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("arl_test_command", SCRIPTS / "test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _part(name: str) -> tuple[str, int, float, list]:
    return name, 0, 0.0, []


def test_the_apps_part_starts_beside_the_last_package_part(scripts):
    """With two slots the apps part starts once the short package parts are done, while the long one still
    runs: here the long part can only end after the apps part has started."""
    apps_started = threading.Event()

    def package_part(name: str):
        if name == "long":
            assert apps_started.wait(60), "the apps part waited for the long package part"
        return _part(name)

    def apps_part():
        apps_started.set()
        return _part("apps")

    results = scripts.run_parts(["long", "a", "b"], 2, package_part, apps_part)
    assert [r[0] for r in results] == ["long", "a", "b", "apps"]


def test_a_part_waiting_for_its_engine_leaves_its_slot_to_the_parts_behind_it(scripts):
    """The first part is not ready (its Docker engine is being made ready): both slots run the parts behind
    it meanwhile, and it takes the first slot that frees once it is ready, before any part still waiting."""
    b_started, engine_ready, started = threading.Event(), threading.Event(), []

    def package_part(name: str):
        started.append(name)
        if name == "a":  # the engine is ready once "a" and "b" hold both slots
            assert b_started.wait(60)
            engine_ready.set()
        if name == "b":
            b_started.set()
            assert engine_ready.wait(60)
        return _part(name)

    results = scripts.run_parts(
        ["docker", "a", "b", "c"],
        2,
        package_part,
        None,
        ready=lambda p: p != "docker" or engine_ready.is_set(),
    )
    assert [r[0] for r in results] == ["docker", "a", "b", "c"]
    assert started[:2] == ["a", "b"] and started.index("docker") < started.index("c")


def test_one_job_runs_the_apps_part_after_every_package_part(scripts):
    ended: list[str] = []

    def package_part(name: str):
        ended.append(name)
        return _part(name)

    def apps_part():
        assert ended == ["long", "a", "b"]
        return _part("apps")

    results = scripts.run_parts(["long", "a", "b"], 1, package_part, apps_part)
    assert [r[0] for r in results] == ["long", "a", "b", "apps"]
    assert [r[0] for r in scripts.run_parts(["a"], 2, package_part, None)] == ["a"]


def test_a_part_s_skips_and_their_reasons_reach_the_summary(scripts, tmp_path):
    import skip_report

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_fake.py").write_text(FAKE_TESTS)
    (tmp_path / "test_no_tmux.py").write_text(
        'import pytest\npytest.skip("tmux is not installed", allow_module_level=True)\n'
    )
    junit = tmp_path / "fake.xml"
    rc, output = scripts.run_part(
        sys.executable,
        [str(tmp_path)],
        [*skip_report.junit_args(junit), "-p", "no:randomly", "-p", "no:cacheprovider"],
        scripts._env(),
        capture=True,
    )
    assert rc == 0, output
    skips = skip_report.read_skips(junit)
    assert sorted((s.test, s.reason) for s in skips) == [
        ("test_fake.py::TestBox::test_inner", "needs a CUDA GPU"),
        ("test_fake.py::test_gpu", "needs a CUDA GPU"),
        ("test_fake.py::test_param[2]", "no docker daemon answers"),
        ("test_no_tmux.py", "tmux is not installed"),
    ]
    lines = scripts.summary(
        [("fake", rc, 3.2, skips), ("clean", 0, 1.0, []), ("broken", 1, 0.5, None)],
        wall_s=5.0,
        docker_note="dockerd answers on unix:///run/arl-docker/docker.sock",
    )
    assert lines[:5] == [
        "fake         passed                   3 s   4 skipped",
        "clean        passed                   1 s   0 skipped",
        "broken       FAILED (exit 1)          0 s",
        "wall                                  5 s",
        "docker       dockerd answers on unix:///run/arl-docker/docker.sock",
    ]
    reasons = lines[lines.index("skipped, and why:") + 1 :]
    assert "fake: 2 skipped: needs a CUDA GPU" in reasons
    assert reasons[reasons.index("fake: 2 skipped: needs a CUDA GPU") + 1].split(", ") == [
        "    test_fake.py::test_gpu",
        "test_fake.py::TestBox::test_inner",
    ]
    assert "fake: 1 skipped: tmux is not installed" in reasons
    assert "broken: no report of its skips (pytest did not write its JUnit XML)" in reasons
    assert not any(line.startswith("clean") for line in reasons)


def test_the_lint_part_runs_ruff_check_and_the_format_check_and_fails_on_either(scripts, tmp_path):
    """`lint`: `ruff check` and `ruff format --check`, both run, each finding a line naming its file."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ruff]\nline-length = 110\n[tool.ruff.lint]\nselect = ["F"]\n'
    )
    (tmp_path / "clean.py").write_text("x = [1, 2]\n")
    rc, output = scripts.run_lint(scripts._env(), root=tmp_path)
    assert rc == 0, output
    assert [line for line in output.splitlines() if line.startswith("$ ruff")] == [
        "$ ruff check --output-format concise .",
        "$ ruff format --check --output-format concise .",
    ]
    (tmp_path / "unused.py").write_text("import os\n")  # formatted, but F401
    (tmp_path / "unformatted.py").write_text("x = [1,2]\n")  # lint-clean, but not formatted
    rc, output = scripts.run_lint(scripts._env(), root=tmp_path)
    assert rc == 1, output
    assert "unused.py:1:8: F401" in output
    assert "unformatted.py:1:8: unformatted: File would be reformatted" in output
    assert "clean.py" not in output
    assert output.splitlines()[-1] == scripts.LINT_FIX
    # In the summary: an outcome and a time, no skips (not a pytest part).
    assert scripts.summary([("lint", rc, 0.4, None), ("fake", 0, 1.0, [])], wall_s=1.4) == [
        "lint         FAILED (exit 1)          0 s",
        "fake         passed                   1 s   0 skipped",
        "wall                                  1 s",
    ]


def _fake_docker_scripts(folder: Path, *, install_fails: bool) -> Path:
    folder.mkdir()
    log = folder / "calls"
    steps = {
        "install.sh": 'echo "install.sh: apt-get: permission denied" >&2; exit 1'
        if install_fails
        else 'echo "install.sh: ok" >&2',
        "start.sh": 'echo "start.sh: dockerd answers" >&2; '
        'echo "export DOCKER_HOST=unix:///tmp/fake.sock ARL_DOCKER_STARTED=1"',
        "build_base_image.sh": 'echo "build_base_image.sh: no mmdebstrap: run scripts/docker/install.sh" >&2; exit 1',
        "stop.sh": "true",
    }
    for name, body in steps.items():
        (folder / name).write_text(f'#!/usr/bin/env bash\necho {name} "$DOCKER_HOST" >> {log}\n{body}\n')
    return log


def test_the_engine_is_started_where_it_can_be_and_stopped_after(scripts, tmp_path, monkeypatch):
    import docker_setup

    log = _fake_docker_scripts(tmp_path / "docker", install_fails=False)
    monkeypatch.setattr(docker_setup, "DOCKER_SCRIPTS", tmp_path / "docker")
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    engine = docker_setup.prepare(env | {"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"})
    assert engine.host == "unix:///tmp/fake.sock" and engine.started
    assert engine.note == (
        "dockerd answers on unix:///tmp/fake.sock (started by this run, stopped once the parts that need it end); "
        "no SWE base image, its tests skip: build_base_image.sh: no mmdebstrap: run "
        "scripts/docker/install.sh"
    )
    docker_setup.stop(engine, env)
    assert log.read_text().split("\n")[:4] == [
        f"install.sh unix://{tmp_path}/nothing.sock",
        f"start.sh unix://{tmp_path}/nothing.sock",
        "build_base_image.sh unix:///tmp/fake.sock",
        "stop.sh ",
    ]


def test_an_engine_that_cannot_be_installed_is_a_note_not_a_failure(scripts, tmp_path, monkeypatch):
    import docker_setup

    log = _fake_docker_scripts(tmp_path / "docker", install_fails=True)
    monkeypatch.setattr(docker_setup, "DOCKER_SCRIPTS", tmp_path / "docker")
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    engine = docker_setup.prepare(env)
    assert engine == docker_setup.DockerEngine(
        None, False, "no engine: scripts/docker/install.sh failed: install.sh: apt-get: permission denied"
    )
    docker_setup.stop(engine, env)  # nothing was started: nothing to stop
    assert log.read_text() == "install.sh \n"
