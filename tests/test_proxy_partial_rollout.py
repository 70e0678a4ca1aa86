"""The proxy in front of the rollout server manager, across a weight sync (partial rollout).

An OpenAI client talks to arl-proxy; the proxy's generator is arl-rollout's ServerManager over a
simulated engine; mid-turn the weights change through a real arl-sync transfer. The client sees one
uninterrupted completion, and the recorded trajectory keeps every sampled token with its log prob
and the weight version that sampled it (mask 1), with template tokens at mask 0 / version -1.
"""

import asyncio

import msgspec
import torch
from openai import AsyncOpenAI

from arl.proxy import ChatProxy, ProxyConfig
from arl.rollout import ServerManager
from arl.rollout.testing import SimEngine
from arl.sync import SyncConfig, WeightSender
from arl_train.tiny_model import build_tokenizer


async def test_turn_spanning_a_weight_sync_is_recorded_token_exact():
    tokenizer = build_tokenizer()
    engine = SimEngine(vocab_size=1000, token_delay_s=0.01)  # ordinary tokens only (specials are >= 1000)
    manager = ServerManager([engine])
    sync_config = SyncConfig(transport="cpu", timeout_s=30)
    sender = WeightSender(sync_config, num_receivers=1)
    async with ChatProxy(tokenizer, manager, ProxyConfig()) as proxy:
        session = proxy.open_session()
        client = AsyncOpenAI(base_url=session.base_url, api_key="unused", timeout=60)
        messages = [{"role": "user", "content": "Count for me."}]
        turn = asyncio.create_task(
            client.chat.completions.create(model="m", messages=messages, max_tokens=60)
        )
        while not engine.calls:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.15)  # some tokens sampled with version 0

        await manager.pause("abort")
        send = asyncio.to_thread(sender.send, {"w": torch.ones(3)}, 1)
        await asyncio.gather(send, manager.load_weights(sender.address, msgspec.json.encode(sync_config), 1))
        await manager.resume()
        first = await asyncio.wait_for(turn, 60)
        assert first.choices[0].finish_reason == "length"
        assert first.usage.completion_tokens == 60

        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Again."},
        ]
        second = await client.chat.completions.create(model="m", messages=messages, max_tokens=5)
        assert second.usage.completion_tokens == 5
        traj = proxy.pop_session(session.id)
    sender.close()

    assert manager.resumed_requests == 1 and engine.weight_version == 1
    assert traj.num_turns == 2
    sampled = [i for i, m in enumerate(traj.response_mask) if m == 1]
    assert len(sampled) == 65  # every sampled token is trained on, nothing else
    versions = [traj.weight_versions[i] for i in sampled]
    assert versions[0] == 0 and versions[59] == 1 and versions[60:] == [1] * 5
    assert versions[:60] == sorted(versions[:60])  # version 0 up to the sync, version 1 after
    # The first turn's tokens are exactly the engine's: a continuation with no gap at the resume point.
    first_turn = [traj.response_ids[i] for i in sampled[:60]]
    assert all((b - a) % 1000 == 1 for a, b in zip(first_turn, first_turn[1:]))
    assert all(traj.response_logprobs[i] < 0 for i in sampled)
    template = [i for i, m in enumerate(traj.response_mask) if m == 0]
    assert template and all(
        traj.weight_versions[i] == -1 and traj.response_logprobs[i] == 0.0 for i in template
    )
