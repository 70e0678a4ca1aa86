"""Test doubles for arl-rollout that ship with the package (no vLLM needed).

`SimEngine` implements the `Engine` protocol with deterministic tokens at a configurable pace, so
pause/abort/resume and partial rollout can be exercised exactly; it receives weights through a real
arl-sync receiver and keeps them in `weights`. `TokenAgentLoop` needs no tokenizer.
`save_random_qwen3` and `hf_logprobs` build a small random model and give reference log probs, for
checking engines exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.engine import PauseMode


class SimEngine:
    """A scripted engine: token i of a request is `(last prompt token + i + 1) % vocab_size`."""

    def __init__(self, *, vocab_size: int = 1000, token_delay_s: float = 0.0, eos_token_id: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.token_delay_s = token_delay_s
        self.eos_token_id = eos_token_id
        self.weights: dict[str, Any] = {}
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self._version = 0
        self._running = asyncio.Event()
        self._running.set()
        self._abort = asyncio.Event()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._receiver: Any = None

    @property
    def weight_version(self) -> int:
        return self._version

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams) -> TokenOutput:
        self.calls.append((request_id, list(prompt_ids), sampling_params))
        await self._running.wait()
        self._in_flight += 1
        self._idle.clear()
        tokens: list[int] = []
        reason = "length"
        try:
            last = prompt_ids[-1] if prompt_ids else 0
            for i in range(sampling_params.max_tokens):
                if self._abort.is_set():
                    reason = "abort"
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                    if self._abort.is_set():
                        reason = "abort"
                        break
                token = (last + i + 1) % self.vocab_size
                tokens.append(token)
                if token in sampling_params.stop_token_ids or token == self.eos_token_id:
                    reason = "stop"
                    break
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        version = self._version
        return TokenOutput(
            token_ids=tokens,
            log_probs=[-0.5 - 0.01 * (t % 7) for t in tokens],
            stop_reason=reason,  # type: ignore[arg-type]
            weight_versions=[version] * len(tokens),
        )

    async def abort_all(self) -> None:
        self._abort.set()
        await self._idle.wait()
        self._abort.clear()

    async def pause(self, mode: PauseMode) -> None:
        self._running.clear()
        if mode == "abort":
            await self.abort_all()
        elif mode == "wait":
            await self._idle.wait()

    async def resume(self) -> None:
        self._running.set()

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        from arl.sync import SyncConfig, WeightReceiver

        if self._receiver is None:
            self._receiver = WeightReceiver(sync_address, msgspec.json.decode(sync_config_json, type=SyncConfig))
        staged: dict[str, Any] = {}

        def apply(named: Any) -> None:
            staged.update({name: t.clone() for name, t in named})

        applied = await asyncio.to_thread(self._receiver.receive, apply=apply)
        self.weights = staged
        self._version = applied


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
            segments.append(Segment(prompt_ids=prompt, response_ids=list(out.token_ids), response_mask=[1] * n,
                                    response_logprobs=list(out.log_probs),
                                    weight_versions=list(out.weight_versions or [-1] * n)))
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


def save_random_qwen3(path: Any, *, vocab: int, hidden: int, head_dim: int, max_positions: int) -> Any:
    """A random 2-layer Qwen3 (tied embeddings, seed 0) saved as an HF folder, without a tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
                      max_position_embeddings=max_positions, tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def hf_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """Log probs of `tokens` after `prompt` under a transformers model (the reference for engines)."""
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def save_random_qwen3_moe(path: Any, *, vocab: int = 256, hidden: int = 64, head_dim: int = 32, layers: int = 2,
                          experts: int = 8, top_k: int = 2, max_positions: int = 512, router_std: float = 0.02,
                          seed: int = 0) -> Any:
    """A random Qwen3-MoE (every layer sparse, tied embeddings) saved as an HF folder, without a tokenizer.
    `router_std` sets the router weights' spread: larger means fewer near-ties between experts."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=head_dim, num_experts=experts, num_experts_per_tok=top_k,
                         norm_topk_prob=True, max_position_embeddings=max_positions, tie_word_embeddings=True)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, router_std)
    model.save_pretrained(path)
    return path


class MixedGroupAgentLoop(TokenAgentLoop):
    """A `TokenAgentLoop` whose group members end differently, by the request id's index suffix:
    `-0` fails (failure_kind "sandbox", not trainable); `-1` renders a longer first prompt (as a
    first-turn context overflow or a hostname in the prompt would) and ends "length" with failure_kind
    "context_length"; the others are normal. For tests of groups with failed and odd members."""

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.rollout.types import AgentResult

        index = request_id.rsplit("-", 1)[-1]
        if index == "0":
            return AgentResult(prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                               weight_versions=[], reward=0.0, failed=True, failure_kind="sandbox",
                               error="sandbox did not start", timings={"environment_setup": 0.5})
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
