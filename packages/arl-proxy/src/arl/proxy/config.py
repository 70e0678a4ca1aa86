"""`ProxyConfig`: every knob of the chat proxy, as a documented msgspec struct (loadable from TOML)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ToolParserName = Literal["hermes", "qwen3_coder", "llama3_json"]


class ProxyConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Configuration of a `ChatProxy`."""

    # Address to bind. Loopback by default; bind "0.0.0.0" explicitly for sandboxes on other hosts.
    host: str = "127.0.0.1"
    # Port to bind; 0 picks any free port.
    port: int = 0
    # Host written into session base URLs; None = `host`, or this machine's address when binding all interfaces.
    advertise_host: str | None = None
    # Tool-call parser applied to completions when the request has tools: "hermes", "qwen3_coder",
    # "llama3_json", or None (content returned as is).
    tool_parser: ToolParserName | None = None
    # Model name reported by /models and in responses (requests may name any model).
    model_name: str = "arl-policy"
    # When set, every request must carry `Authorization: Bearer <api_key>`.
    api_key: str | None = None
    # Largest accepted request body, in bytes.
    max_body_bytes: int = 32 * 1024 * 1024
    # Context limit in tokens (prompt + completion); None = the tokenizer's model_max_length when sane.
    max_context_len: int | None = None
    # Completion length when the request names none; None = whatever the context leaves.
    default_max_tokens: int | None = None
    # End the session after this many assistant turns in a row without a tool call (None = never).
    max_consecutive_no_tool: int | None = None
    # Seconds to wait for one generation before answering 504.
    generate_timeout_s: float = 1800.0
    # Chat template to use instead of the tokenizer's own (Jinja source).
    chat_template: str | None = None
    # Default keyword arguments of the template (e.g. {"enable_thinking": False}); a request's
    # `chat_template_kwargs` overrides them.
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    # Token ids that end a generation besides the template's end-of-turn token and the tokenizer's EOS.
    extra_stop_token_ids: list[int] = msgspec.field(default_factory=list)
    # How an appended turn is checked before only its new messages are tokenized: "window" renders the
    # prompt messages + the last assistant turn + the new messages (cost flat in history length);
    # "full" renders the whole conversation every turn (catches templates that rewrite old turns from
    # far away, costs O(history) per turn).
    incremental_check: Literal["window", "full"] = "window"
    # Record a trajectory as token-exact segments: when a turn's rendered prompt no longer extends the tokens
    # so far (Qwen3 dropping earlier reasoning or empty think blocks, an agent condensing its history), the
    # sequence so far is kept as a finished segment and a new one starts, so every sampled token is trained
    # once. False keeps one sequence, where tokens sampled before a rewrite end up with mask 0.
    segments: bool = True
    # Threads that tokenize long texts (a resumed history's first render, a rebuild: tens of thousands of
    # tokens), with the GIL released, so they do not stall the event loop every other session is served on;
    # 0 = everything on the event loop. Rendering and short texts always run on the loop (see below).
    tokenize_threads: int = 4
    # Texts shorter than this many characters are tokenized on the event loop: a turn's new messages cost
    # well under a millisecond there, less than handing them to a thread (packages/arl-proxy/BENCHMARKS.md).
    tokenize_inline_chars: int = 4096
    # The first-generation threshold of Python's cyclic garbage collector, raised to this for the whole
    # process when the proxy starts (never lowered; 0 leaves the interpreter's). At CPython's 700 a full
    # collection over the tokenizer's and the sessions' objects runs every ~70k allocations and stalls every
    # session for 10+ ms: p99 added per turn 12-17 ms against 1.5-2.2 ms at 30,000 (BENCHMARKS.md).
    gc_threshold: int = 30_000
    # Serve session management routes (POST /sessions, GET/DELETE /sessions/{id}...); the standalone
    # server turns them on.
    admin_routes: bool = False
    # Sessions opened over HTTP (admin routes) write their debug JSON under trajectory_root/<session id>.
    trajectory_root: str | None = None

    def __post_init__(self) -> None:
        if self.gc_threshold < 0:
            raise ValueError(
                f"gc_threshold must be >= 0 (0 leaves the interpreter's), got {self.gc_threshold}"
            )
