"""A client that goes away before its reply is delivered leaves nothing wrong (issue #31).

A real aiohttp client reads part of a reply (the opening chunk of a stream, or the first bytes of a large
one) and closes its connection. The turn must not be recorded (the agent never saw those tokens), the
engine call must be aborted when it is still running, the drop is counted, and the agent's retry of the
same turn is recorded exactly as if the first attempt had never happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from arl.proxy import ChatProxy, ProxyConfig, Trajectory
from arl.proxy.testing import Scripted, ScriptedGenerator

FIRST = "The answer is 42."
SECOND = "Glad to help."
SPACES = " " * 128  # one token of the Qwen3 vocabulary: 128 bytes of reply per sampled token


def long_reply_tokens() -> int:
    """Enough 128-byte tokens that a reply outgrows every buffer between proxy and client (twice the
    kernel's largest TCP send buffer plus 1 MiB), so a client that stops reading and closes catches the
    proxy mid-write."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmem_max = int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        wmem_max = 4 << 20
    return 2 * (wmem_max + (1 << 20)) // len(SPACES) + 1


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `cond` until it holds or `timeout` passes; returns whether it held."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.01)
    return True


class Served:
    """A proxy on a ScriptedGenerator, served either by `ChatProxy.start()` (aiohttp's default: handlers
    are not cancelled when a client disconnects) or embedded in a server run with `handler_cancellation`."""

    def __init__(self, proxy: ChatProxy, gen: ScriptedGenerator, url: str) -> None:
        self.proxy, self.gen, self.url = proxy, gen, url

    def chat_url(self, sid: str) -> str:
        return f"{self.url}/sessions/{sid}/v1/chat/completions"

    def client(self, sid: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/sessions/{sid}/v1", api_key="unused", max_retries=0)


@pytest.fixture(params=["own-server", "handler-cancellation"])
async def served(request, qwen3_tok) -> AsyncIterator[Served]:
    gen = ScriptedGenerator(qwen3_tok, [])
    # generate_timeout_s bounds how long a proxy without the fix waits for a generation nobody ends;
    # max_context_len leaves room for the long reply of the delivery tests.
    proxy = ChatProxy(qwen3_tok, gen, ProxyConfig(generate_timeout_s=30.0, max_context_len=1 << 22))
    await proxy.start()
    runner = None
    url = proxy.base_url
    if request.param == "handler-cancellation":
        runner = web.AppRunner(proxy.build_app(), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    yield Served(proxy, gen, url)
    if runner is not None:
        await runner.cleanup()
    await proxy.stop()


def small_receive_buffer(addr_info: Any) -> socket.socket:
    """A client socket with a small fixed receive buffer (no autotuning), so unread data backs up at once."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    return sock


async def ask(client: AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One turn through the openai SDK; the assistant message as the agent keeps it."""
    if not stream:
        resp = await client.chat.completions.create(model="m", messages=messages)
        return {"role": "assistant", "content": resp.choices[0].message.content}
    content = ""
    finished = None
    async for c in await client.chat.completions.create(model="m", messages=messages, stream=True):
        if c.choices:
            content += c.choices[0].delta.content or ""
            finished = c.choices[0].finish_reason or finished
    assert finished == "stop"
    return {"role": "assistant", "content": content}


def recorded(traj: Trajectory) -> Trajectory:
    """The trajectory without what differs between two sessions of the same turns (id, drop count)."""
    return msgspec.structs.replace(traj, session_id="", dropped_turns=0)


async def control_trajectory(
    served: Served, messages: list[dict[str, Any]], replies: list[str], stream: bool
) -> Trajectory:
    """The same turns in a fresh session where every reply was delivered."""
    session = served.proxy.open_session()
    convo: list[dict[str, Any]] = []
    async with served.client(session.id) as client:
        for msg, reply in zip(messages, replies):
            served.gen.extend([reply])
            convo.append(msg)
            convo.append(await ask(client, convo, stream))
    return served.proxy.pop_session(session.id)


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_during_generation_aborts_and_records_nothing(served, stream):
    """The client leaves while the engine is still decoding: the generation is aborted, nothing is
    recorded, and an immediate retry of the same turn (it queues behind the dropped one) is recorded once."""
    proxy, gen = served.proxy, served.gen
    hold = asyncio.Event()  # the engine "decodes" until this is set
    gen.extend([Scripted(FIRST, wait=hold), FIRST, SECOND])
    session = proxy.open_session()
    user1 = {"role": "user", "content": "What is the answer?"}
    body = {"model": "m", "messages": [user1], "stream": stream}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        if stream:
            resp = await http.post(served.chat_url(session.id), json=body)
            assert resp.status == 200
            opening = await resp.content.readline()  # the role chunk, sent before generation
            assert opening.startswith(b"data: ") and b'"role":"assistant"' in opening
            assert await wait_until(lambda: gen.in_flight == 1)
            resp.close()  # gone mid-stream
        else:
            pending = asyncio.create_task(http.post(served.chat_url(session.id), json=body))
            assert await wait_until(lambda: gen.in_flight == 1)
            pending.cancel()  # the agent gives up on the request: aiohttp closes the connection
            with contextlib.suppress(asyncio.CancelledError):
                await pending
        # The agent retries the same turn at once, while the dropped one may still hold the session.
        client = served.client(session.id)
        retry = asyncio.create_task(ask(client, [user1], stream))
        aborted = await wait_until(lambda: gen.calls[0].aborted, timeout=5.0)
        hold.set()  # an engine that was never told to stop finishes now (that reply must not be recorded)
        reply1 = await asyncio.wait_for(retry, 60)
        assert reply1 == {"role": "assistant", "content": FIRST}
        # The session goes on normally after the retry.
        user2 = {"role": "user", "content": "Thanks."}
        await ask(client, [user1, reply1, user2], stream)
        await client.close()
    assert aborted, "the proxy did not abort the generation of a client that disconnected"
    assert gen.in_flight == 0 and gen.calls[0].output is None  # no engine call left running
    assert len(gen.calls) == 3 and gen.calls[1].prompt_ids == gen.calls[0].prompt_ids  # the same turn again
    traj = proxy.pop_session(session.id)
    assert traj.dropped_turns == 1 and proxy.dropped_turns == 1
    assert traj.num_turns == 2, "the dropped turn was recorded as well as its retry"
    control = await control_trajectory(served, [user1, user2], [FIRST, SECOND], stream)
    assert control.dropped_turns == 0
    assert recorded(traj) == recorded(control)  # token for token as if the first attempt never happened


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_during_delivery_records_nothing(served, stream):
    """The engine finished, but the client reads only part of the reply and closes: nothing is recorded
    (the agent never saw the whole reply), the drop is counted, and the retry is recorded normally."""
    proxy, gen = served.proxy, served.gen
    hold = asyncio.Event()
    spaces = proxy.codec.encode(SPACES)
    assert len(spaces) == 1
    gen.extend([Scripted(spaces * long_reply_tokens(), wait=hold), SECOND])
    session = proxy.open_session()
    user1 = {"role": "user", "content": "Indent a lot."}
    body = {"model": "m", "messages": [user1], "stream": stream}
    connector = aiohttp.TCPConnector(socket_factory=small_receive_buffer)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        pending = asyncio.create_task(http.post(served.chat_url(session.id), json=body))
        assert await wait_until(lambda: gen.in_flight == 1)
        hold.set()
        resp = await asyncio.wait_for(pending, 60)
        assert resp.status == 200
        if stream:
            assert b'"role":"assistant"' in await resp.content.readline()
        part = await asyncio.wait_for(resp.content.readexactly(64 * 1024), 60)  # the reply is on its way
        assert SPACES.encode() in part
        resp.close()  # ... and the client is gone with most of it unread

        def settled() -> bool:  # the proxy is done with the turn, one way or the other
            return proxy.get_trajectory(session.id).num_turns > 0 or proxy.dropped_turns > 0

        assert await wait_until(settled, timeout=30.0)
    traj = proxy.get_trajectory(session.id)
    assert traj.num_turns == 0, "a turn the client never received in full was recorded"
    assert traj.segments == [] and traj.generated_tokens == 0
    assert not gen.calls[0].aborted and gen.calls[0].output is not None  # it had finished: nothing to abort
    assert traj.dropped_turns == 1
    # The retry (a short reply this time) is recorded as the session's first turn.
    async with served.client(session.id) as client:
        reply = await ask(client, [user1], stream)
    assert reply == {"role": "assistant", "content": SECOND}
    traj = proxy.pop_session(session.id)
    control = await control_trajectory(served, [user1], [SECOND], stream)
    assert traj.num_turns == 1 and recorded(traj) == recorded(control)


async def test_delivered_turns_count_no_drop(served):
    """A client that reads every reply to the end (streamed and not) has every turn recorded, none dropped,
    and each turn is in the trajectory as soon as the client has its reply (a `pop_session` right after the
    agent's last reply loses nothing)."""
    replies = [FIRST, SECOND, FIRST, SECOND]
    served.gen.extend(replies)
    session = served.proxy.open_session()
    convo: list[dict[str, Any]] = []
    async with served.client(session.id) as client:
        for i, _ in enumerate(replies):
            convo.append({"role": "user", "content": f"Q{i}"})
            convo.append(await ask(client, convo, stream=i % 2 == 0))
            assert served.proxy.get_trajectory(session.id).num_turns == i + 1
    traj = served.proxy.pop_session(session.id)
    assert traj.num_turns == len(replies) and traj.dropped_turns == 0 and served.proxy.dropped_turns == 0
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{served.url}/health") as resp:
            assert (await resp.json())["dropped_turns"] == 0
