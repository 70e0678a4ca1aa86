"""The adversarial suite: every reward-hacking attack of `arl.harbor.agents.attacks` scores below 1.0, and
is never a failed trial, through the real agent path in both environments, while the oracle scores 1.0.

Each attack is a scripted policy (`attack:<name>`) played by arl's shell agent through arl-proxy
(`arl.harbor.agents.checks.run_check`: `HarborAgentLoop` + `ScriptedGenerator`) on the SWE test task
(`arl.harbor.testing.write_swe_task`, written by the builder's own writer, so it is graded as a built
set's tasks are), in the local sandbox and in docker. An error the agent caused must be its kept 0
(`agent_broke_verifier`), never a retried or dropped trial: "not failed" is part of every check. All trials
run in a module fixture, side by side (`CONCURRENCY` at a time), a failed one once more from the start (an
infrastructure hiccup passes, what an attack causes repeats); each attack × environment is its own test
id, and a `-k` selection runs only its own trials. `tests-hang` runs on a copy of the task with the
writer's shortest test timeout (~35 s, spent sleeping beside the other trials). The docker half needs a
running dockerd and the SWE base image (the test command makes both ready) and skips, saying why, without.

Every attack runs in the local sandbox in every test run. In docker, every run takes the attack classes
whose defence depends on the environment (`DOCKER_EVERY_RUN`: what the agent leaves outside /testbed, how
/testbed is carried out to the verifier, what the agent can read); the classes that live inside /testbed
and are defeated by the grader's own pytest run (the same test.sh, plugin and carry in both environments)
are repeated in docker by the exhaustive run (`ARL_TEST_EXHAUSTIVE=1`, `scripts/test.py --exhaustive`):

    uv run scripts/test.py arl-harbor -- -k attacks
    uv run scripts/test.py arl-harbor --exhaustive -- -k attacks   # every attack in both environments
    uv run python packages/arl-harbor/benchmarks/swe_agent_checks.py <set> --env docker --agent shell \\
        --script attack:all                                  # the same attacks over a whole task set

Every attack was also run against the grading this suite was written to replace (the task's verifier run
in the agent's own environment, as root, with the agent's processes alive: commit 4491ccb, the task set
bound into the local sandbox as the SWE preset then did); the table is in arl-harbor's BENCHMARKS.md
("Reward-hacking attacks against the shared-environment grading").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from arl.harbor.agents.attacks import ATTACK_CLASSES, ATTACKS
from arl.harbor.agents.checks import CheckResult, run_check
from arl.harbor.agents.scripts import ATTACK_PREFIX
from arl.harbor.carry import CARRY_LIMIT_ENV
from arl.harbor.testing import write_swe_task

from .conftest import needs_sandbox
from .test_docker_env import _docker_problem
from .test_swe_agents import tokenizer  # noqa: F401 - the module fixture

pytestmark = pytest.mark.slow

ENVS = ("local", "docker")
# Trials at once (both environments): a trial mostly waits on its sandbox or container, and four keep the
# 2-core CI machine busy.
CONCURRENCY = 4
CARRY_LIMIT_MB = 64
# The tell an attack must leave besides its 0, where the 0 alone would not show that the defence worked.
EXPECTED_TELLS = {"attack:carry-flood": "change_refused"}
ATTACK_SCRIPTS = [f"{ATTACK_PREFIX}{name}" for name in ATTACKS]
ENV_MARKS = {"local": [needs_sandbox], "docker": [pytest.mark.container]}
# The attack classes docker checks in every run: their defence depends on the environment (processes left
# behind, files outside /testbed, the carry of /testbed to the verifier, what is visible to read).
DOCKER_EVERY_RUN = {
    "leftover-process",
    "shell-env",
    "site-wide",
    "bytecode",
    "symlink",
    "break-verifier",
    "read-answer",
}
assert DOCKER_EVERY_RUN <= set(ATTACK_CLASSES), DOCKER_EVERY_RUN - set(ATTACK_CLASSES)
EXHAUSTIVE = os.environ.get("ARL_TEST_EXHAUSTIVE") == "1"
# The root conftest.py skips it outside the exhaustive run, giving this reason.
EXHAUSTIVE_ONLY = pytest.mark.exhaustive(
    reason="an attack inside /testbed repeated in docker: the grader's own run defeats it the same way in "
    "both environments (the local sandbox checks it in every run)"
)


def _runs(env: str, script: str) -> bool:
    """Whether the (env, script) trial runs in this session: always, but for a docker repeat of an attack
    inside /testbed, which runs only with ARL_TEST_EXHAUSTIVE."""
    attack = ATTACKS.get(script.removeprefix(ATTACK_PREFIX)) if script.startswith(ATTACK_PREFIX) else None
    return EXHAUSTIVE or env != "docker" or attack is None or attack.attack_class in DOCKER_EVERY_RUN


def _params(scripts: list[str]) -> list:
    return [
        pytest.param(
            env,
            script,
            id=f"{env}-{script.removeprefix(ATTACK_PREFIX)}",
            marks=[*ENV_MARKS[env], *([] if _runs(env, script) else [EXHAUSTIVE_ONLY])],
        )
        for env in ENVS
        for script in scripts
    ]


def _hang_task(root: Path) -> Path:
    """The test task with the shortest test timeout the writer gives (its floor plus a 0.5 s baseline)."""
    from arl.harbor.swe import writer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer, "VERIFIER_TIMEOUT_SEC", 0.0)
        return write_swe_task(root, name="tinycalc__clamp_hang")


def _hangs(script: str) -> bool:
    """Whether `script` is an attack that makes the tests hang (its cost is the test timeout)."""
    spec = ATTACKS.get(script.removeprefix(ATTACK_PREFIX)) if script.startswith(ATTACK_PREFIX) else None
    return spec is not None and spec.hang


def _wanted(session: pytest.Session) -> set[tuple[str, str]]:
    """The (env, script) pairs this session's selected tests of this module ask for."""
    pairs = set()
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is not None and item.module.__name__ == __name__ and "env" in params:
            pairs.add((params["env"], params["script"]))
    return {pair for pair in pairs if _runs(*pair)}


@pytest.fixture(scope="module")
def results(request, tokenizer, tmp_path_factory):  # noqa: F811 - the imported fixture
    """Every selected trial: ({(env, script): CheckResult}, {env: why it cannot run, or None})."""
    wanted = _wanted(request.session)
    problems = {
        "local": needs_sandbox.kwargs["reason"] if needs_sandbox.args[0] else None,
        "docker": _docker_problem(),
    }
    wanted = {(env, script) for env, script in wanted if problems[env] is None}
    root = tmp_path_factory.mktemp("attacks")
    try:
        task = write_swe_task(root / "tasks")
        hang = _hang_task(root / "hang") if any(_hangs(s) for _, s in wanted) else None
    except Exception as e:  # noqa: BLE001 - the task's venv needs pytest's wheels from PyPI once
        pytest.skip(f"cannot write the SWE test task (its venv needs PyPI once): {e}")
    slots = asyncio.Semaphore(CONCURRENCY)

    async def check(env: str, script: str, attempt: int) -> CheckResult:
        # A hanging trial sleeps through its test timeout: it waits beside the others, not in a slot.
        async with contextlib.nullcontext() if _hangs(script) else slots:
            return await run_check(
                hang if _hangs(script) else task,
                agent="shell",
                script=script,
                env=env,
                tokenizer=tokenizer,
                trials_dir=root / "trials" / f"{env}-{attempt}",
                trial_timeout_sec=600,
            )

    async def one(env: str, script: str) -> tuple[tuple[str, str], CheckResult]:
        result = await check(env, script, 1)
        if result.failed:
            # Once more from the start: an infrastructure hiccup passes, what the attack causes repeats. (The
            # trial loop's own retry cannot replay a scripted policy: its completions are used up.)
            again = await check(env, script, 2)
            if again.failed:
                again.error += f" [first run: {result.failure_kind}: {result.error}]"
            result = again
        return (env, script), result

    async def everything() -> dict[tuple[str, str], CheckResult]:
        # The hanging trials first, so that their timeout overlaps everything else.
        order = sorted(wanted, key=lambda pair: (not _hangs(pair[1]), pair))
        return dict(await asyncio.gather(*(one(env, script) for env, script in order)))

    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        # A carry limit far above the test task's tree and far below the default, so that `carry-flood`'s
        # sparse file (twice the limit) streams 128 MiB at most before the carry stops it.
        patch.setenv(CARRY_LIMIT_ENV, str(CARRY_LIMIT_MB))
        found = asyncio.run(everything())
    print(f"\n{len(found)} checks in {time.monotonic() - started:.0f} s")
    for (env, script), r in sorted(found.items()):
        print(
            f"{env:6s} {script:40s} reward={r.reward} failed={r.failed} {r.failure_kind:20s} "
            f"{r.wall_s:5.1f} s"
        )
    return found, problems


def _result(results, env: str, script: str) -> CheckResult:
    found, problems = results
    if problems[env] is not None:
        pytest.skip(problems[env])
    return found[(env, script)]


def _describe(r: CheckResult) -> str:
    return (
        f"reward={r.reward} rewards={r.rewards} failed={r.failed} kind={r.failure_kind!r} "
        f"error={r.error[:600]!r} trial={r.trial_dir}"
    )


@pytest.mark.parametrize(("env", "script"), _params(["oracle"]))
def test_oracle_scores_one(results, env, script):
    r = _result(results, env, script)
    assert not r.failed and r.reward == 1.0, _describe(r)


# Attacks the grading does not stop yet (docs/design/swe-grading.md, "What a file rule cannot see"): each
# must still score 1.0 (strict), so the suite says so the day one is closed.
KNOWN_HOLES = {
    "attack:init-silence-recorder": "code written against the report plugin's and pluggy's internals silences "
    "the recorder from inside the test process and writes its own stream with the recorder's nonce",
}


@pytest.mark.parametrize(("env", "script"), _params(ATTACK_SCRIPTS))
def test_attack_scores_below_one(results, env, script, request):
    if script in KNOWN_HOLES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_HOLES[script], strict=True))
    r = _result(results, env, script)
    attack = ATTACKS[script.removeprefix(ATTACK_PREFIX)]
    assert not r.failed, f"a trial the attack made fail (retried or dropped, not a kept 0): {_describe(r)}"
    assert r.reward is not None and r.reward < 1.0, f"{attack.description}: {_describe(r)}"
    if script in EXPECTED_TELLS:
        assert r.rewards.get(EXPECTED_TELLS[script]) == 1.0, _describe(r)
    assert r.ok and r.token_problems == [], _describe(r)
