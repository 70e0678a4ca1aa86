"""What a turn costs the proxy: where it tokenizes, and a ratio a loaded machine cannot fake.

The ratio check is the one timed assertion of this package. 16 sessions x 30 tool turns run at once over
HTTP with the default config; from turn 21 on, each session's client re-renders and re-tokenizes its whole
history right after each reply (what a proxy without incremental tokenization does every turn), in the
same process, interleaved with the proxy's turns, so load on the machine slows both alike. The proxy's
tokenization per turn (`TurnTiming.tokenize`, hand-offs to threads and waits included) must stay at least
`MIN_RATIO` times cheaper at the median. It failed with the thread pool default of 518b2cf (every turn's
tokenization handed to 4 threads that held the GIL); the margin measured on the 2-core machine is in
packages/arl-proxy/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import aiohttp
import pytest
from arl_proxy_helpers import TOOLS

from arl.proxy import ChatProxy, ProxyConfig, SamplingParams, TokenOutput
from arl.proxy.testing import ScriptedGenerator

SESSIONS, TURNS, FROM_TURN = 16, 30, 21
MIN_RATIO = 5.0
TOOL_OUTPUT = "".join(
    f"src/module_{k}.py: def function_{k}(x): return x * {k}  # line {k}\n" for k in range(8)
)


class PerSession:
    """One ScriptedGenerator per session (request id), yielding to the loop like an engine would."""

    def __init__(self) -> None:
        self.gens: dict[str, ScriptedGenerator] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        await asyncio.sleep(0)
        return await self.gens[request_id].generate(request_id, prompt_ids, sp)


def _script(i: int) -> list[str]:
    return [
        f'Step {t} of task {i}.\n<tool_call>\n{{"name": "bash", "arguments": {{"cmd": "grep -rn f_{t} src/"}}}}'
        "\n</tool_call>"
        for t in range(TURNS)
    ]


async def _session(
    http: aiohttp.ClientSession, proxy: ChatProxy, engine: PerSession, tok, i: int, full_ms: list[float]
) -> None:
    s = proxy.open_session()
    engine.gens[s.id] = ScriptedGenerator(tok, _script(i))
    messages = [
        {"role": "system", "content": "You are a careful software engineering agent."},
        {"role": "user", "content": f"Task {i}: find and fix the bug in the repository."},
    ]
    for turn in range(1, TURNS + 1):
        async with http.post(
            s.base_url + "/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS}
        ) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        if turn >= FROM_TURN:  # the whole history this turn was prompted with, rendered and tokenized anew
            t0 = time.perf_counter()
            proxy.codec.encode(proxy.codec.render(messages, TOOLS, True))
            full_ms.append((time.perf_counter() - t0) * 1e3)
        msg = {k: v for k, v in body["choices"][0]["message"].items() if v is not None}
        messages += [
            msg,
            {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": TOOL_OUTPUT},
        ]
        await asyncio.sleep(0)
    traj = proxy.pop_session(s.id)
    assert traj.rebuilds == 0 and traj.num_turns == TURNS


async def test_incremental_tokenization_is_cheaper_than_a_full_rerender(qwen3_tok):
    engine = PerSession()
    full_ms: list[float] = []
    async with ChatProxy(qwen3_tok, engine, ProxyConfig(tool_parser="hermes")) as proxy:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=SESSIONS)) as http:
            await asyncio.gather(
                *(_session(http, proxy, engine, qwen3_tok, i, full_ms) for i in range(SESSIONS))
            )
        proxy_ms = [t.tokenize * 1e3 for t in proxy.timings if t.turn >= FROM_TURN]
    assert len(proxy_ms) == len(full_ms) == SESSIONS * (TURNS - FROM_TURN + 1)
    ratio = statistics.median(full_ms) / statistics.median(proxy_ms)
    print(
        f"full re-render {statistics.median(full_ms):.3f} ms / proxy {statistics.median(proxy_ms):.3f} ms "
        f"per turn (medians, turns {FROM_TURN}-{TURNS}): {ratio:.1f}x"
    )
    assert ratio >= MIN_RATIO, (
        f"the proxy's tokenization per turn is only {ratio:.1f}x cheaper than a full "
        f"re-render (need {MIN_RATIO}x)"
    )


class _Threads:
    """Wraps a codec's `encode`: which thread tokenized texts of which length."""

    def __init__(self, codec) -> None:
        self.calls: list[tuple[int, str]] = []
        self._encode = codec.encode
        codec.encode = self

    def __call__(self, text: str) -> list[int]:
        self.calls.append((len(text), threading.current_thread().name))
        return self._encode(text)


@pytest.mark.parametrize("threads", [0, 2])
async def test_long_texts_are_tokenized_off_the_loop_short_ones_on_it(qwen3_tok, threads):
    gen = ScriptedGenerator(qwen3_tok, ["Looking.", "Done."])
    config = ProxyConfig(tokenize_threads=threads, tokenize_inline_chars=2000)
    async with ChatProxy(qwen3_tok, gen, config) as proxy:
        seen = _Threads(proxy.codec)
        s = proxy.open_session()
        messages = [{"role": "user", "content": "Read this log:\n" + "line of the build log\n" * 200}]
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(
                    s.base_url + "/chat/completions", json={"model": "m", "messages": messages}
                ) as resp:
                    reply = (await resp.json())["choices"][0]["message"]
                messages += [reply, {"role": "user", "content": "And now?"}]
    loop_thread = threading.main_thread().name
    first, later = seen.calls[0], seen.calls[1:]
    assert first[0] >= 2000 and (first[1].startswith("arl-proxy-tok") if threads else first[1] == loop_thread)
    assert later and all(n < 2000 and name == loop_thread for n, name in later)


class _WithoutBackend:
    """A tokenizer without a Rust backend (a slow, Python-side one): its encode holds the GIL."""

    def __init__(self, tok) -> None:
        self._tok = tok

    def __getattr__(self, name: str):
        if name == "backend_tokenizer":
            raise AttributeError(name)
        return getattr(self._tok, name)


async def test_a_tokenizer_that_holds_the_gil_tokenizes_on_the_loop(tiny_tok):
    tok = _WithoutBackend(tiny_tok)
    gen = ScriptedGenerator(tiny_tok, ["Done."])
    async with ChatProxy(tok, gen, ProxyConfig(tokenize_inline_chars=0)) as proxy:
        assert not proxy.codec.encode_releases_gil
        seen = _Threads(proxy.codec)
        s = proxy.open_session()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                s.base_url + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "Hello world."}]},
            ) as r:
                assert r.status == 200
        assert (
            proxy.pop_session(s.id).prompt_ids
            == tiny_tok.apply_chat_template(
                [{"role": "user", "content": "Hello world."}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
    assert seen.calls and all(name == threading.main_thread().name for _, name in seen.calls)
