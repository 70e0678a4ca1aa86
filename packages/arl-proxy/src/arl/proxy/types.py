"""Wire types of arl-proxy: what the proxy asks of an inference engine and what it gets back.

`SamplingParams` and `TokenOutput` live here, in the lightest package that needs them, so that the
rollout side's server manager and every engine adapter speak the same `Generator` seam.
"""

from __future__ import annotations

from typing import Any, Literal

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
    # Keep generating past the model's end-of-sequence token (vLLM's meaning: `stop_token_ids` still
    # stop); benchmarks use it with max_tokens to get exact response lengths from a random model.
    ignore_eos: bool = False


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


class Trajectory(msgspec.Struct, kw_only=True):
    """The token-exact record of one agent session, ready for training.

    `prompt_ids + response_ids` is the token sequence the model saw at its last turn (plus that turn's
    sampled tokens and backfilled end-of-turn tail). `response_mask` is 1 exactly on tokens the model
    sampled in this very context, and `response_logprobs` holds their sampled log probs (0.0 where the
    mask is 0).
    """

    session_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    # 1 = token sampled by the model, 0 = template, tool output, user text, backfilled tail, rebuilt text.
    response_mask: list[int]
    response_logprobs: list[float]
    # Generation calls committed to this trajectory.
    num_turns: int
    # The final conversation: the last request's messages plus the last assistant reply (normalized).
    messages: list[dict[str, Any]]
    # The last turn's OpenAI finish reason ("stop", "tool_calls", "length", "abort"), "max_consecutive_no_tool"
    # when the proxy ended the session, or None before any turn.
    finish_reason: str | None
    # How many times the history was rewritten and the sequence rebuilt segment by segment.
    rebuilds: int
    tools: list[dict[str, Any]] | None = None
    # Per response token: the policy version that sampled it, -1 where the mask is 0 (None if the generator
    # reported none).
    weight_versions: list[int] | None = None
    # Per response token: MoE routing (layers x top-k), [] where the mask is 0 (None if never reported).
    routed_experts: list[list[list[int]]] | None = None


class SessionInfo(msgspec.Struct, kw_only=True):
    """What `ChatProxy.open_session` returns: the session id and the OpenAI base URL the agent should use."""

    id: str
    base_url: str
    trajectory_dir: str | None = None
