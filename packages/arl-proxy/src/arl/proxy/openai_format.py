"""OpenAI response shapes: chat completions, streaming chunks, logprobs, usage, model lists."""

from __future__ import annotations

import time
from typing import Any

from arl.proxy.chat import ChatCodec
from arl.proxy.completion import Reply


def logprobs_block(codec: ChatCodec, reply: Reply, top_n: int) -> dict[str, Any]:
    """OpenAI `choices[].logprobs` for every sampled token."""
    content = []
    tops = reply.top_logprobs or []
    for i, (tid, lp) in enumerate(zip(reply.token_ids, reply.log_probs)):
        tok = codec.token_text(tid)
        alts = []
        if top_n and i < len(tops):
            for alt_id, alt_lp in tops[i][:top_n]:
                alt = codec.token_text(alt_id)
                alts.append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode("utf-8"))})
        content.append(
            {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8")), "top_logprobs": alts}
        )
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    *,
    completion_id: str,
    model: str,
    reply: Reply,
    prompt_ids: list[int],
    logprobs: dict[str, Any] | None,
    return_token_ids: bool,
) -> dict[str, Any]:
    """A non-streaming `chat.completion` object (with vLLM's `prompt_token_ids`/`token_ids` when asked)."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": reply.openai_message(),
        "logprobs": logprobs,
        "finish_reason": reply.finish_reason,
        "stop_reason": None,
    }
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(len(prompt_ids), len(reply.token_ids)),
    }
    if return_token_ids:
        choice["token_ids"] = reply.token_ids
        body["prompt_token_ids"] = prompt_ids
    return body


def chunk(
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One `chat.completion.chunk`; `delta=None` makes the usage-only chunk (empty choices)."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    if delta is None:
        body["choices"] = []
    else:
        body["choices"] = [
            {
                "index": 0,
                "delta": delta,
                "logprobs": extra.pop("logprobs", None),
                "finish_reason": finish_reason,
                **extra,
            }
        ]
    return body


def stream_chunks(
    *,
    completion_id: str,
    model: str,
    reply: Reply,
    prompt_ids: list[int],
    logprobs: dict[str, Any] | None,
    return_token_ids: bool,
    include_usage: bool,
) -> list[dict[str, Any]]:
    """The chunks after the opening role chunk: content, tool calls, the finish chunk, optional usage."""
    created = int(time.time())
    out: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if return_token_ids:
        extra["token_ids"] = reply.token_ids
    if reply.content or logprobs is not None or extra:
        out.append(
            chunk(completion_id, model, created, {"content": reply.content or ""}, logprobs=logprobs, **extra)
        )
    for i, call in enumerate(reply.tool_calls):
        out.append(
            chunk(
                completion_id,
                model,
                created,
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                    ]
                },
            )
        )
    out.append(chunk(completion_id, model, created, {}, reply.finish_reason))
    if include_usage:
        u = chunk(completion_id, model, created, None)
        u["usage"] = usage(len(prompt_ids), len(reply.token_ids))
        out.append(u)
    return out


def models_body(model: str, max_context_len: int | None) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": 0,
                "owned_by": "arl",
                "max_model_len": max_context_len,
            }
        ],
    }
