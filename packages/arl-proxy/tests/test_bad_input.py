"""Bad input and safety: every problem is a 4xx with an OpenAI-style error body; nothing else breaks."""

from __future__ import annotations

import aiohttp
import pytest

from arl.proxy import ChatProxy, ProxyConfig
from arl.proxy.errors import UnknownSessionError
from arl.proxy.testing import ScriptedGenerator

GOOD = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
async def served(qwen25_tok):
    gen = ScriptedGenerator(qwen25_tok, [])
    proxy = ChatProxy(qwen25_tok, gen, ProxyConfig(max_body_bytes=64 * 1024, max_context_len=2048))
    await proxy.start()
    async with aiohttp.ClientSession() as http:
        yield proxy, gen, http
    await proxy.stop()


async def post(http, url, payload=None, data=None, headers=None):
    async with http.post(url, json=payload if data is None else None, data=data, headers=headers) as resp:
        return resp.status, await resp.json()


def chat_url(session) -> str:
    return session.base_url + "/chat/completions"


@pytest.mark.parametrize(
    "body,status,code,needle",
    [
        (b"{not json", 400, "invalid_request", "not valid JSON"),
        (b"[1, 2]", 400, "invalid_request", "JSON object"),
        (b'{"model": "m"}', 400, "invalid_messages", "'messages' is required"),
        (b'{"messages": "hello"}', 400, "invalid_messages", "non-empty list"),
        (b'{"messages": []}', 400, "invalid_messages", "non-empty list"),
        (b'{"messages": [42]}', 400, "invalid_messages", "messages[0] must be an object"),
        (b'{"messages": [{"content": "x"}]}', 400, "invalid_messages", "messages[0].role"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "invalid_messages", "'wizard'"),
        (b'{"messages": [{"role": "user", "content": 7}]}', 400, "invalid_messages", "content must be"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            400,
            "invalid_messages",
            "image_url",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}',
            400,
            "invalid_messages",
            "assistant message",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400, "invalid_request", "n=2"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"}',
            400,
            "invalid_request",
            "max_tokens",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            400,
            "invalid_request",
            "at least 1",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
            400,
            "invalid_request",
            "tools[0]",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}',
            400,
            "invalid_request",
            "tool_choice",
        ),
        (
            b'{"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": {}}]}, '
            b'{"role": "user", "content": "y"}]}',
            400,
            "invalid_messages",
            "tool_calls[0]",
        ),
    ],
)
async def test_bad_requests(served, body, status, code, needle):
    proxy, gen, http = served
    s = proxy.open_session()
    got, err = await post(http, chat_url(s), data=body, headers={"Content-Type": "application/json"})
    assert got == status
    assert err["error"]["code"] == code and needle in err["error"]["message"], err
    assert gen.calls == []
    # The same session still works afterwards.
    gen.extend(["Hello."])
    got, ok = await post(http, chat_url(s), GOOD)
    assert got == 200 and ok["choices"][0]["message"]["content"] == "Hello."


async def test_unknown_and_closed_sessions(served):
    proxy, gen, http = served
    got, err = await post(http, f"{proxy.base_url}/sessions/not-a-session/v1/chat/completions", GOOD)
    assert got == 404 and err["error"]["code"] == "unknown_session"
    s = proxy.open_session()
    proxy.pop_session(s.id)
    got, err = await post(http, chat_url(s), GOOD)
    assert got == 404 and err["error"]["code"] == "unknown_session"
    with pytest.raises(UnknownSessionError):
        proxy.pop_session(s.id)
    async with http.get(f"{proxy.base_url}/no/such/route") as resp:
        assert resp.status == 404 and "error" in await resp.json()


async def test_body_too_large_and_context_limit(served):
    proxy, gen, http = served
    s = proxy.open_session()
    big = {"messages": [{"role": "user", "content": "x" * (100 * 1024)}]}
    got, err = await post(http, chat_url(s), big)
    assert got == 413 and err["error"]["code"] == "request_too_large"
    long = {"messages": [{"role": "user", "content": "word " * 3000}]}
    got, err = await post(http, chat_url(s), long)
    assert got == 400 and err["error"]["code"] == "context_length_exceeded"
    assert "2048" in err["error"]["message"]
    assert gen.calls == []
    gen.extend(["Fine."])
    got, ok = await post(http, chat_url(s), GOOD)
    assert got == 200
    # max_tokens beyond the room left is clipped to it.
    assert gen.calls[-1].sampling_params.max_tokens == 2048 - len(gen.calls[-1].prompt_ids)


async def test_generator_failure_leaves_session_usable(served):
    proxy, gen, http = served
    s = proxy.open_session()
    got, err = await post(http, chat_url(s), GOOD)  # the script is empty: the generator raises
    assert got == 502 and err["error"]["type"] == "upstream_error"
    gen.extend(["Recovered."])
    got, ok = await post(http, chat_url(s), GOOD)
    assert got == 200 and ok["choices"][0]["message"]["content"] == "Recovered."
    traj = proxy.pop_session(s.id)
    assert traj.num_turns == 1 and traj.rebuilds == 0


async def test_bearer_token(qwen25_tok):
    gen = ScriptedGenerator(qwen25_tok, ["ok"])
    async with ChatProxy(qwen25_tok, gen, ProxyConfig(api_key="s3cret")) as proxy:
        s = proxy.open_session()
        async with aiohttp.ClientSession() as http:
            for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                got, err = await post(http, chat_url(s), GOOD, headers=headers)
                assert got == 401 and err["error"]["type"] == "authentication_error"
            got, ok = await post(http, chat_url(s), GOOD, headers={"Authorization": "Bearer s3cret"})
            assert got == 200
            async with http.get(f"{proxy.base_url}/health") as resp:
                assert resp.status == 200


async def test_session_ids_and_default_bind(qwen25_tok):
    gen = ScriptedGenerator(qwen25_tok, [])
    async with ChatProxy(qwen25_tok, gen) as proxy:
        assert proxy.config.host == "127.0.0.1" and proxy.base_url.startswith("http://127.0.0.1:")
        ids = {proxy.open_session().id for _ in range(1000)}
        assert len(ids) == 1000
        # token_urlsafe(24): 32 characters of 6 bits = 192 random bits.
        assert all(len(i) >= 32 for i in ids)
    explicit = ChatProxy(qwen25_tok, gen, ProxyConfig(host="0.0.0.0", advertise_host="10.1.2.3"))
    await explicit.start()
    try:
        assert explicit.base_url.startswith("http://10.1.2.3:")
    finally:
        await explicit.stop()
