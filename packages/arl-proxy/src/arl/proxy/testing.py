"""Test double: `ScriptedGenerator`, a `Generator` that replays scripted completions (no model needed).

Each `generate` call returns the next scripted completion:
- a string: encoded with the tokenizer; a stop token (the first of `sampling_params.stop_token_ids`, i.e.
  the template's end-of-turn token, else the tokenizer's EOS) is appended, unless the text contains one of
  the request's stop strings (then it is cut after the token that completes it, as vLLM stops) or the
  completion is marked truncated;
- a list of token ids: returned as is (stop reason "stop" if it ends in a stop token, else "length");
- a `Scripted(...)` for full control (truncation, explicit stop reason, weight versions, routed experts, and
  `wait`: an `asyncio.Event` the call waits for before it returns, like an engine still decoding).
Completions longer than `max_tokens` are cut to it with stop reason "length". Log probs are deterministic,
non-zero and differ by position and token. A call cancelled while it waits is an abort, as the `Generator`
seam defines it: it is marked `aborted` in `calls` and has consumed its scripted completion.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from arl.proxy.errors import ScriptExhaustedError
from arl.proxy.types import SamplingParams, StopReason, TokenOutput


@dataclass(slots=True)
class Scripted:
    """One scripted completion with options."""

    completion: str | list[int]
    truncated: bool = False  # no stop token appended; stop reason "length"
    stop_reason: StopReason | None = None  # override the computed one
    weight_version: int | None = None  # report this version for every token
    routed_experts: bool = False  # report fake routing (2 layers x top-2) per token
    wait: asyncio.Event | None = None  # generate() returns only once this is set (cancellable meanwhile)


@dataclass(slots=True)
class GenerateCall:
    """One recorded call of `ScriptedGenerator.generate`."""

    request_id: str
    prompt_ids: list[int]
    sampling_params: SamplingParams
    output: TokenOutput | None = None
    aborted: bool = False  # cancelled before it returned (the caller aborted the generation)


def scripted_logprob(token_id: int, position: int) -> float:
    """The deterministic log prob `ScriptedGenerator` reports: in [-2.0, -0.001], never 0."""
    return -(((token_id * 2654435761 + position * 40503) % 2000) + 1) / 1000.0


@dataclass
class ScriptedGenerator:
    """Replays `completions` in order, one per `generate` call, for every session alike."""

    tokenizer: Any
    completions: list[str | list[int] | Scripted]
    calls: list[GenerateCall] = field(default_factory=list)
    in_flight: int = 0  # generate calls started and not yet returned or aborted
    _next: int = 0

    def extend(self, completions: list[str | list[int] | Scripted]) -> None:
        self.completions.extend(completions)

    @property
    def remaining(self) -> int:
        return len(self.completions) - self._next

    def _encode(self, text: str) -> list[int]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        call = GenerateCall(request_id, list(prompt_ids), sampling_params)
        self.calls.append(call)
        if self._next >= len(self.completions):
            raise ScriptExhaustedError(f"ScriptedGenerator has only {len(self.completions)} completions")
        item = self.completions[self._next]
        self._next += 1
        if isinstance(item, Scripted) and item.wait is not None:
            self.in_flight += 1
            try:
                await item.wait.wait()
            except asyncio.CancelledError:
                call.aborted = True
                raise
            finally:
                self.in_flight -= 1
        out = self.render(item, sampling_params)
        call.output = out
        return out

    def render(self, item: str | list[int] | Scripted, sp: SamplingParams) -> TokenOutput:
        """The TokenOutput for one scripted completion under `sp` (no state change)."""
        spec = item if isinstance(item, Scripted) else Scripted(item)
        stop_ids = list(sp.stop_token_ids)
        eos = stop_ids[0] if stop_ids else self.tokenizer.eos_token_id
        reason: StopReason
        if isinstance(spec.completion, list):
            ids = list(spec.completion)
            reason = "stop" if ids and ids[-1] in stop_ids else "length"
        else:
            ids = self._encode(spec.completion)
            reason = "length" if spec.truncated else "stop"
            cut = self._stop_string_cut(ids, sp.stop)
            if cut is not None:
                ids, reason = ids[:cut], "stop"
            elif not spec.truncated:
                ids.append(eos)
        if len(ids) > sp.max_tokens:
            ids, reason = ids[: sp.max_tokens], "length"
        if spec.stop_reason is not None:
            reason = spec.stop_reason
        lps = [scripted_logprob(t, i) for i, t in enumerate(ids)]
        tops = None
        if sp.top_logprobs:
            tops = [
                [(t, lp)] + [((t + k) % 1000, lp - k) for k in range(1, sp.top_logprobs)]
                for t, lp in zip(ids, lps)
            ]
        versions = [spec.weight_version] * len(ids) if spec.weight_version is not None else None
        experts = (
            [[[t % 8, (t + 1) % 8], [(t + 2) % 8, (t + 3) % 8]] for t in ids] if spec.routed_experts else None
        )
        return TokenOutput(
            token_ids=ids,
            log_probs=lps,
            stop_reason=reason,
            weight_versions=versions,
            routed_experts=experts,
            top_logprobs=tops,
        )

    def _stop_string_cut(self, ids: list[int], stop: list[str]) -> int | None:
        if not stop or not any(s in self._decode(ids) for s in stop):
            return None
        for j in range(1, len(ids) + 1):  # the first token that completes a stop string
            text = self._decode(ids[:j])
            if any(s in text for s in stop):
                return j
        return None
