"""Wire types of arl-proxy: what the proxy asks of an inference engine and what it gets back.

`SamplingParams` and `TokenOutput` live here, in the lightest package that needs them, so that the
rollout side's server manager and every engine adapter speak the same `Generator` seam.
"""

from __future__ import annotations

from typing import Literal

import msgspec

StopReason = Literal["stop", "length", "abort"]


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Sampling settings for one generation call (a subset of vLLM's, with its meanings)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    # Token ids that end the generation; the stop token itself is included in the output.
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    # Strings that end the generation; like vLLM, the matched string is not part of the output text.
    stop: list[str] = msgspec.field(default_factory=list)
    # Top log probs per sampled token to return besides the sampled one (0 = sampled only).
    top_logprobs: int = 0


class TokenOutput(msgspec.Struct, kw_only=True):
    """The result of one generation call: exactly the tokens the engine sampled."""

    token_ids: list[int]
    # Log prob of each sampled token under the sampling policy; same length as token_ids.
    log_probs: list[float]
    stop_reason: StopReason
    # Per token, the weight version of the policy that sampled it (changes mid-sequence on partial rollout).
    weight_versions: list[int] | None = None
    # Mixture-of-experts routing per token (layers x top-k expert ids), for routing replay.
    routed_experts: list[list[list[int]]] | None = None
    # Per token, the top alternatives as (token_id, log_prob) pairs, when asked for.
    top_logprobs: list[list[tuple[int, float]]] | None = None
