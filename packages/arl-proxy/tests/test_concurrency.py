"""64 sessions at once with interleaved turns keep separate trajectories, tokenizing on the event loop,
in the proxy's thread pool, or as the default splits it (short texts on the loop, long ones in the pool)."""

from __future__ import annotations

import asyncio
import random

import pytest
from arl_proxy_helpers import TOOLS, check_trajectory, one_shot
from openai import AsyncOpenAI

from arl.proxy import ChatProxy, ProxyConfig, SamplingParams, TokenOutput
from arl.proxy.testing import ScriptedGenerator

N, TURNS = 64, 4


class PerSession:
    """Dispatches by request id to one ScriptedGenerator per session, yielding in between to interleave."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.gens: dict[str, ScriptedGenerator] = {}
        self.request_ids: list[str] = []

    async def generate(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        self.request_ids.append(request_id)
        await asyncio.sleep(random.random() * 0.01)
        return await self.gens[request_id].generate(request_id, prompt_ids, sp)


@pytest.mark.parametrize("field", ["tokenize_threads", "tokenize_inline_chars"])
def test_negative_tokenize_settings_are_refused(qwen25_tok, field):
    with pytest.raises(ValueError, match=field):
        ChatProxy(qwen25_tok, PerSession(qwen25_tok), ProxyConfig(**{field: -1}))


@pytest.mark.parametrize(
    "tokenize", [{"tokenize_threads": 0}, {}, {"tokenize_inline_chars": 0}], ids=["loop", "default", "pool"]
)
async def test_64_concurrent_sessions(qwen25_tok, tokenize):
    random.seed(0)
    router = PerSession(qwen25_tok)
    async with ChatProxy(qwen25_tok, router, ProxyConfig(tool_parser="hermes", **tokenize)) as proxy:

        async def agent(i: int):
            s = proxy.open_session()
            script = [
                f'<tool_call>\n{{"name": "bash", "arguments": {{"cmd": "echo {i}-{t}"}}}}\n</tool_call>'
                for t in range(TURNS - 1)
            ] + [f"Agent {i} is done."]
            router.gens[s.id] = ScriptedGenerator(qwen25_tok, script)
            client = AsyncOpenAI(base_url=s.base_url, api_key="x", max_retries=0)
            messages = [{"role": "user", "content": f"You are agent {i}."}]
            for t in range(TURNS):
                await asyncio.sleep(random.random() * 0.01)
                r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                msg = r.choices[0].message.model_dump(exclude_none=True)
                messages.append(msg)
                if t < TURNS - 1:
                    assert msg["tool_calls"][0]["function"]["arguments"] == f'{{"cmd": "echo {i}-{t}"}}'
                    messages.append(
                        {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"{i}-{t}"}
                    )
            await client.close()
            return s.id, messages

        results = await asyncio.gather(*(agent(i) for i in range(N)))
        # Turns really interleaved across sessions.
        switches = sum(a != b for a, b in zip(router.request_ids, router.request_ids[1:]))
        assert switches > N
        for sid, messages in results:
            traj = proxy.pop_session(sid)
            assert traj.num_turns == TURNS and traj.rebuilds == 0
            assert traj.prompt_ids + traj.response_ids == one_shot(qwen25_tok, messages, TOOLS)
            check_trajectory(traj, router.gens[sid])
            assert {c.request_id for c in router.gens[sid].calls} == {sid}  # stable per session
        assert proxy.session_ids == []
