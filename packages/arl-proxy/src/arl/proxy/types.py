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


class Segment(msgspec.Struct, kw_only=True):
    """One token-exact piece of a trajectory: a sequence the model saw, with what it sampled in it marked.

    `prompt_ids + response_ids` is exactly a token sequence the engine was given (plus the tokens it sampled
    and the template's end-of-turn tail). A segment ends where a later turn's rendered prompt no longer
    extends its tokens (the template or the agent rewrote earlier turns); the next segment starts with that
    turn's whole prompt. Every token the engine sampled has mask 1 in exactly one segment.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    # 1 = token sampled by the model in this very context, 0 = template, tool output, user text, backfilled tail.
    response_mask: list[int]
    # Sampled log prob where the mask is 1, 0.0 where it is 0.
    response_logprobs: list[float]
    # Per response token: the policy version that sampled it, -1 where the mask is 0 (None if the generator
    # reported none).
    weight_versions: list[int] | None = None
    # Per response token: MoE routing (layers x top-k), [] where the mask is 0 (None if never reported).
    routed_experts: list[list[list[int]]] | None = None

    @property
    def num_sampled(self) -> int:
        """Tokens with mask 1 (sampled in this segment's context)."""
        return sum(self.response_mask)


class Trajectory(msgspec.Struct, kw_only=True):
    """The token-exact record of one agent session, ready for training.

    `segments` is the whole record: one segment while the conversation only grows, a new one each time a
    turn's rendered prompt does not extend the previous segment's tokens (with `ProxyConfig(segments=False)`,
    always one, where tokens sampled before a rewrite keep mask 0). Train on every segment.

    The flat fields `prompt_ids`, `response_ids`, `response_mask`, `response_logprobs`, `weight_versions` and
    `routed_experts` are the LAST segment, for callers that want one sequence: `prompt_ids + response_ids` is
    the token sequence the model saw at its last turn (plus that turn's sampled tokens and backfilled
    end-of-turn tail). When the history was rewritten they hold only part of what was sampled; see `segments`.
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
    # The token-exact segments, in order (the last one is the flat fields above); [] before any turn.
    segments: list[Segment] = msgspec.field(default_factory=list)
    # Tokens the engine sampled into this session, all turns (tokens a stop string cut off are not in it).
    generated_tokens: int = 0
    # Requests whose reply never reached the agent in full (it disconnected or stopped reading): not recorded
    # anywhere above (no tokens, no turn, no messages); their generation was aborted if still running.
    dropped_turns: int = 0

    @property
    def num_sampled(self) -> int:
        """Tokens with mask 1 over all segments (each sampled token counts once)."""
        return sum(s.num_sampled for s in self.segments)

    @property
    def trained_share(self) -> float:
        """Share of the generated tokens that have mask 1 somewhere: 1.0 with segments (or no rewrite),
        less when `ProxyConfig(segments=False)` loses tokens sampled before a rewrite."""
        return self.num_sampled / self.generated_tokens if self.generated_tokens else 1.0


class SessionInfo(msgspec.Struct, kw_only=True):
    """What `ChatProxy.open_session` returns: the session id and the OpenAI base URL the agent should use."""

    id: str
    base_url: str
    trajectory_dir: str | None = None
