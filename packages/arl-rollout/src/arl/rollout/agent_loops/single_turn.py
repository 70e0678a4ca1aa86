"""The single-turn agent loop: render the chat, generate once, score with the task's reward function."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from arl.proxy.generator import Generator
from arl.proxy.types import SamplingParams
from arl.rollout.agent_loop import register_agent_loop
from arl.rollout.rewards import get_reward
from arl.rollout.types import AgentResult, Task


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of the chat template with the generation prompt, exactly as the template renders."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


class SingleTurnAgentLoop:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    async def run(
        self, task: Task, generator: Generator, sampling_params: SamplingParams, request_id: str
    ) -> AgentResult:
        prompt_ids = render_prompt(self.tokenizer, task.messages)
        # `ignore_eos` (exact-length benchmark workloads) keeps the end-of-turn token from stopping it.
        eos = [] if sampling_params.ignore_eos else self._eos
        params = msgspec.structs.replace(
            sampling_params, stop_token_ids=sorted(set(sampling_params.stop_token_ids) | set(eos))
        )
        started = time.perf_counter()
        out = await generator.generate(request_id, prompt_ids, params)
        elapsed = time.perf_counter() - started
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        reward = get_reward(task.reward_fn)(text, task.ground_truth)
        n = len(out.token_ids)
        return AgentResult(
            prompt_ids=prompt_ids,
            response_ids=list(out.token_ids),
            response_mask=[1] * n,
            response_logprobs=list(out.log_probs),
            weight_versions=list(out.weight_versions) if out.weight_versions else [-1] * n,
            reward=reward,
            finish_reason=out.stop_reason,
            routed_experts=out.routed_experts,
            timings={"generate": elapsed},
        )


register_agent_loop("single_turn", SingleTurnAgentLoop)
