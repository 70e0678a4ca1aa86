"""Agent loops for tests that need no tokenizer: the task's `metadata["prompt_ids"]` go straight to the
generator and the reward is the fraction of even tokens (deterministic, so tests can check it).

`TokenAgentLoop` is one turn; `SegmentedAgentLoop` several turns whose history is rewritten (one
segment per turn); `MixedGroupAgentLoop` ends group members differently (failed, context overflow).
"""

from __future__ import annotations

from typing import Any

from arl.proxy.types import SamplingParams


class TokenAgentLoop:
    """An agent loop without a tokenizer: the task's `metadata["prompt_ids"]` go straight to the
    generator; the reward is the fraction of even tokens (deterministic, so tests can check it)."""

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.rollout.types import AgentResult

        prompt_ids = list(task.metadata["prompt_ids"])
        out = await generator.generate(request_id, prompt_ids, sampling_params)
        n = len(out.token_ids)
        return AgentResult(
            prompt_ids=prompt_ids,
            response_ids=out.token_ids,
            response_mask=[1] * n,
            response_logprobs=out.log_probs,
            weight_versions=out.weight_versions or [-1] * n,
            reward=sum(t % 2 == 0 for t in out.token_ids) / max(1, n),
            finish_reason=out.stop_reason,
            routed_experts=out.routed_experts,
        )


class SegmentedAgentLoop:
    """A `TokenAgentLoop` over several turns whose history is rewritten every turn (each next prompt
    replaces the last token sampled before it by a template token, as a chat template dropping part of
    an earlier turn would): one segment per turn, as arl-proxy records them. Reward as `TokenAgentLoop`."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.proxy.types import Segment
        from arl.rollout.types import AgentResult

        prompt = list(task.metadata["prompt_ids"])
        segments: list[Segment] = []
        for _ in range(self.turns):
            out = await generator.generate(request_id, prompt, sampling_params)
            n = len(out.token_ids)
            segments.append(
                Segment(
                    prompt_ids=prompt,
                    response_ids=list(out.token_ids),
                    response_mask=[1] * n,
                    response_logprobs=list(out.log_probs),
                    weight_versions=list(out.weight_versions or [-1] * n),
                )
            )
            prompt = [*prompt, *out.token_ids[:-1], 7]
        first = segments[0]
        sampled = [t for s in segments for t in s.response_ids]
        return AgentResult(
            prompt_ids=first.prompt_ids,
            response_ids=first.response_ids,
            response_mask=first.response_mask,
            response_logprobs=first.response_logprobs,
            weight_versions=list(first.weight_versions or []),
            reward=sum(t % 2 == 0 for t in sampled) / max(1, len(sampled)),
            segments=segments,
            sampled_tokens=len(sampled),
        )


class MixedGroupAgentLoop(TokenAgentLoop):
    """A `TokenAgentLoop` whose group members end differently, by the request id's index suffix:
    `-0` fails (failure_kind "sandbox", not trainable); `-1` renders a longer first prompt (as a
    first-turn context overflow or a hostname in the prompt would) and ends "length" with failure_kind
    "context_length"; the others are normal. For tests of groups with failed and odd members."""

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.rollout.types import AgentResult

        index = request_id.rsplit("-", 1)[-1]
        if index == "0":
            return AgentResult(
                prompt_ids=[],
                response_ids=[],
                response_mask=[],
                response_logprobs=[],
                weight_versions=[],
                reward=0.0,
                failed=True,
                failure_kind="sandbox",
                error="sandbox did not start",
                timings={"environment_setup": 0.5},
            )
        result = await super().run(task, generator, sampling_params, request_id)
        result.timings = {"agent_execution": 1.0}
        if index == "1":
            prompt_ids = [*task.metadata["prompt_ids"], 99, 98]
            out = await generator.generate(request_id + "-long", prompt_ids, sampling_params)
            result.prompt_ids = prompt_ids
            result.response_ids = out.token_ids
            result.response_mask = [1] * len(out.token_ids)
            result.response_logprobs = out.log_probs
            result.weight_versions = out.weight_versions or [-1] * len(out.token_ids)
            result.reward = 0.0
            result.finish_reason = "length"
            result.failure_kind = "context_length"
        return result
