"""Decoding and validating an OpenAI `/chat/completions` request body into a typed `ChatRequest`."""

from __future__ import annotations

from typing import Any

import msgspec

from arl.proxy.errors import BadRequestError, InvalidMessagesError
from arl.proxy.messages import normalize_tools


class StreamOptions(msgspec.Struct, kw_only=True):
    """OpenAI `stream_options`."""

    include_usage: bool = False


class ChatRequest(msgspec.Struct, kw_only=True):
    """The fields of a chat completion request the proxy honours (unknown fields are ignored)."""

    messages: Any = None
    model: str | None = None
    tools: Any = None
    tool_choice: Any = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tools_enabled(self) -> bool:
        """Whether tool calls are parsed: the request has tools and tool_choice is not "none"."""
        return bool(self.tools) and self.tool_choice != "none"


def decode_chat_request(body: bytes) -> ChatRequest:
    """Parse and validate a request body; raises `BadRequestError`/`InvalidMessagesError` naming the problem."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BadRequestError("request body must be a JSON object")
    try:
        req = msgspec.convert(raw, ChatRequest)
    except msgspec.ValidationError as exc:
        param = str(exc).rsplit("at `$.", 1)[-1].rstrip("`") if "at `$." in str(exc) else None
        raise BadRequestError(f"invalid request: {exc}", param=param) from None
    if req.messages is None:
        raise InvalidMessagesError("'messages' is required", param="messages")
    if not isinstance(req.messages, list) or not req.messages:
        raise InvalidMessagesError("'messages' must be a non-empty list of message objects", param="messages")
    if req.n is not None and req.n != 1:
        raise BadRequestError(
            f"n={req.n} is not supported: one trajectory takes one completion per turn (n=1)", param="n"
        )
    mt = req.requested_max_tokens
    if mt is not None and mt < 1:
        raise BadRequestError("max_tokens must be at least 1", param="max_tokens")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise BadRequestError("top_logprobs must be between 0 and 20", param="top_logprobs")
    if req.temperature is not None and req.temperature < 0:
        raise BadRequestError("temperature must be >= 0", param="temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise BadRequestError("top_p must be in (0, 1]", param="top_p")
    tc = req.tool_choice
    if (
        tc is not None
        and tc not in ("none", "auto", "required")
        and not (isinstance(tc, dict) and isinstance(tc.get("function"), dict))
    ):
        raise BadRequestError(
            "tool_choice must be 'none', 'auto', 'required' or a named function", param="tool_choice"
        )
    req.tools = normalize_tools(req.tools)
    return req
