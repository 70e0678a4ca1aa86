"""Real clients against the proxy: the openai SDK (plain, streaming, logprobs, token ids) and LiteLLM."""

from __future__ import annotations

import json
import os

import aiohttp
import pytest
from arl_proxy_helpers import TOOLS, check_trajectory, one_shot
from openai import AsyncOpenAI

from arl.proxy import ChatProxy, ProxyConfig
from arl.proxy.testing import ScriptedGenerator

CALL = 'Checking.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
FINAL = "<think>\nDone.\n</think>\n\nThere are two files."


@pytest.fixture
async def proxy(qwen3_tok):
    gen = ScriptedGenerator(qwen3_tok, [])
    p = ChatProxy(qwen3_tok, gen, ProxyConfig(tool_parser="hermes", model_name="arl-test"))
    await p.start()
    yield p
    await p.stop()


async def test_openai_streaming_matches_plain(proxy, qwen3_tok):
    trajectories = []
    for stream in (False, True):
        proxy.generator.extend([CALL, FINAL])
        s = proxy.open_session()
        client = AsyncOpenAI(base_url=s.base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "How many files?"}]
        for _ in range(2):
            if stream:
                content, calls, finish, usage = "", {}, None, None
                async for ch in await client.chat.completions.create(
                    model="arl-test",
                    messages=messages,
                    tools=TOOLS,
                    stream=True,
                    stream_options={"include_usage": True},
                ):
                    if ch.usage is not None:
                        usage = ch.usage
                    for choice in ch.choices:
                        content += choice.delta.content or ""
                        for tc in choice.delta.tool_calls or []:
                            slot = calls.setdefault(
                                tc.index,
                                {"id": tc.id, "type": "function", "function": {"name": "", "arguments": ""}},
                            )
                            slot["function"]["name"] += tc.function.name or ""
                            slot["function"]["arguments"] += tc.function.arguments or ""
                        finish = choice.finish_reason or finish
                msg = {"role": "assistant", "content": content or None}
                if calls:
                    msg["tool_calls"] = [calls[i] for i in sorted(calls)]
                assert (
                    usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
                )
            else:
                r = await client.chat.completions.create(model="arl-test", messages=messages, tools=TOOLS)
                msg, finish = r.choices[0].message.model_dump(exclude_none=True), r.choices[0].finish_reason
                assert r.model == "arl-test" and r.usage.completion_tokens > 0
            messages.append(msg)
            if finish == "tool_calls":
                assert msg["tool_calls"][0]["function"]["name"] == "bash"
                messages.append(
                    {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "a\nb"}
                )
            else:
                assert finish == "stop" and msg["content"] == FINAL
        traj = proxy.pop_session(s.id)
        assert traj.rebuilds == 0 and traj.num_turns == 2
        assert traj.prompt_ids + traj.response_ids == one_shot(qwen3_tok, messages, TOOLS)
        check_trajectory(traj, proxy.generator)
        trajectories.append(traj.prompt_ids + traj.response_ids)
    assert trajectories[0] == trajectories[1]


async def test_logprobs_and_token_ids(proxy, qwen3_tok):
    proxy.generator.extend(["Hello there."])
    s = proxy.open_session()
    client = AsyncOpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    r = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    out = proxy.generator.calls[-1].output
    choice = r.choices[0]
    assert [c.logprob for c in choice.logprobs.content] == out.log_probs
    assert all(
        len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob for c in choice.logprobs.content
    )
    assert "".join(c.token for c in choice.logprobs.content[:-1]) == "Hello there."
    extra = r.model_extra
    assert extra["prompt_token_ids"] == proxy.generator.calls[-1].prompt_ids
    assert choice.model_extra["token_ids"] == out.token_ids
    assert r.usage.prompt_tokens == len(extra["prompt_token_ids"])
    # Streaming carries token ids too (on the content chunk).
    proxy.generator.extend(["Again."])
    ids = []
    async for ch in await client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello there."},
            {"role": "user", "content": "Again"},
        ],
        stream=True,
        extra_body={"return_token_ids": True},
    ):
        for c in ch.choices:
            ids += (c.model_extra or {}).get("token_ids") or []
    assert ids == proxy.generator.calls[-1].output.token_ids


async def test_models_route(proxy):
    s = proxy.open_session()
    client = AsyncOpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["arl-test"]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base_url}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "arl-test"


@pytest.mark.parametrize("stream", [False, True])
async def test_litellm(qwen25_tok, stream):
    """LiteLLM's hosted_vllm provider (what Harbor's terminus-2 uses), Qwen2.5 template.

    (With Qwen3, LiteLLM moves `<think>...</think>` into `reasoning_content`; an agent must echo it back
    for the template to render the turn as sampled, else the proxy rebuilds.)"""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    gen = ScriptedGenerator(qwen25_tok, [CALL, "There are two files."])
    proxy = ChatProxy(qwen25_tok, gen, ProxyConfig(tool_parser="hermes", model_name="arl-test"))
    await proxy.start()
    s = proxy.open_session()
    messages = [{"role": "user", "content": "How many files?"}]
    for turn in range(2):
        kwargs = dict(
            model="hosted_vllm/arl-test",
            api_base=s.base_url,
            api_key="x",
            messages=messages,
            tools=TOOLS,
            timeout=30,
            num_retries=0,
        )
        if stream:
            chunks = [c async for c in await litellm.acompletion(stream=True, **kwargs)]
            resp = litellm.stream_chunk_builder(chunks, messages=messages)
        else:
            resp = await litellm.acompletion(**kwargs)
        msg = resp.choices[0].message
        if turn == 0:
            assert resp.choices[0].finish_reason == "tool_calls"
            call = msg.tool_calls[0]
            assert call.function.name == "bash" and json.loads(call.function.arguments) == {"cmd": "ls"}
            messages.append(
                {
                    "role": "assistant",
                    "content": msg.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": "bash", "arguments": call.function.arguments},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "a\nb"})
        else:
            assert msg.content == "There are two files."
            messages.append({"role": "assistant", "content": msg.content})
    traj = proxy.pop_session(s.id)
    await proxy.stop()
    assert traj.rebuilds == 0
    assert traj.prompt_ids + traj.response_ids == one_shot(qwen25_tok, messages, TOOLS)
    check_trajectory(traj, gen)
    close = getattr(litellm, "close_litellm_async_clients", None)
    if close is not None:
        await close()
