"""MoE routing on the rollout side: the in-tree engine records it per sampled token, it survives an
abort → resume through the server manager in token order, and vLLM's array is aligned the same way."""

import asyncio

import numpy as np
import pytest
import torch

from arl.proxy.types import SamplingParams
from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig
from arl.rollout.errors import EngineError
from arl.rollout.routed_experts import extend_routes, hf_routers, rows_from_vllm, vllm_prompt_start
from arl.rollout.server_manager import ServerManager
from arl.rollout.testing import save_random_qwen3_moe

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return save_random_qwen3_moe(
        tmp_path_factory.mktemp("moe"), vocab=128, hidden=32, head_dim=16, router_std=1.0
    )


def hf_step_routes(model, ids: list[int]) -> list[list[list[int]]]:
    """Per input position, every layer's top-k (as sorted lists), from one plain HF forward."""
    seen = {}
    hooks = [
        r.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o[2]))
        for i, r in hf_routers(model).items()
    ]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return [[sorted(seen[layer][p].tolist()) for layer in sorted(seen)] for p in range(len(ids))]


async def test_routes_survive_abort_and_resume_in_token_order(moe_dir):
    from transformers import AutoModelForCausalLM

    engine = TorchEngine(TorchEngineConfig(model_path=str(moe_dir), return_routed_experts=True))
    await engine.start()
    manager = ServerManager([engine], generate_timeout_s=120)
    try:
        prompt = [3, 4, 5]
        task = asyncio.create_task(
            manager.generate("r", prompt, SamplingParams(max_tokens=24, temperature=1.0))
        )
        async with asyncio.timeout(60):  # abort mid-generation: once the engine holds a few tokens
            while not any(3 <= len(r.tokens) < 20 for r in engine._requests.values()):
                await asyncio.sleep(0.005)
        await manager.pause("abort")
        await asyncio.sleep(0.05)
        await manager.resume()
        out = await asyncio.wait_for(task, 120)
    finally:
        await engine.stop()
    assert manager.resumed_requests == 1 and out.stop_reason == "length"
    assert out.routed_experts is not None and len(out.routed_experts) == len(out.token_ids) == 24
    # Row j is the routing of the step that sampled token j: input position len(prompt) + j - 1.
    hf = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    ref = hf_step_routes(hf, prompt + out.token_ids)
    got = [[sorted(layer) for layer in row] for row in out.routed_experts]
    assert got == ref[len(prompt) - 1 : len(prompt) - 1 + 24]


def test_vllm_rows_are_aligned_whatever_prompt_start_vllm_honoured():
    prompt_len, n = 5, 3
    full = np.arange((prompt_len + n - 1) * 2 * 2).reshape(-1, 2, 2)  # rows for positions 0..6
    rows = rows_from_vllm(full, prompt_len=prompt_len, num_tokens=n, prompt_start=0)
    assert rows == full[4:7].tolist()
    start = vllm_prompt_start(prompt_len)
    assert rows_from_vllm(full[start:], prompt_len=prompt_len, num_tokens=n, prompt_start=start) == rows
    # A row vLLM did not deliver (e.g. cut by an abort) is left to the trainer, never shifted.
    assert (
        rows_from_vllm(full[start : start + 2], prompt_len=prompt_len, num_tokens=n, prompt_start=start)[2]
        == []
    )
    assert rows_from_vllm(None, prompt_len=prompt_len, num_tokens=n, prompt_start=start) is None


def test_extend_routes_keeps_rows_with_their_tokens():
    a = [[[1, 2]], [[3, 4]]]
    assert extend_routes(None, a, before=0, added=2) == a
    assert extend_routes(a, None, before=2, added=1) == a + [[]]
    assert extend_routes(None, None, before=2, added=1) is None
    with pytest.raises(EngineError, match="do not match"):
        extend_routes(a, a, before=3, added=2)


async def test_rollouter_packs_routes_into_queued_responses(moe_dir):
    from arl.queue import MessageQueue
    from arl.queue.routed_experts import unpack_routes
    from arl.rollout import Rollouter, Task, compute_budget, cycle_tasks
    from arl.rollout.testing import TokenAgentLoop

    engine = TorchEngine(TorchEngineConfig(model_path=str(moe_dir), return_routed_experts=True))
    await engine.start()
    queue = MessageQueue(max_size=8)
    tasks = [
        Task(id=f"t{i}", messages=[], agent="tokens", metadata={"prompt_ids": [i + 1, i + 2]})
        for i in range(4)
    ]
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=2,
        staleness_threshold=0.0,
        trigger_parameter_sync_step=1,
        replicas=1,
        per_replica=4,
    )
    rollouter = Rollouter(
        tasks=cycle_tasks(tasks, seed=0),
        manager=ServerManager([engine]),
        sink=queue,
        agent_loops={"tokens": TokenAgentLoop()},
        sampling_params=SamplingParams(max_tokens=5),
        n=2,
        budget=budget,
        partial_rollout=False,
    )
    run = asyncio.create_task(rollouter.run())
    try:
        samples = await queue.get_batch(2, timeout=120)
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await engine.stop()
    assert len(samples) == 2
    for s in samples:
        for r in s.responses:
            assert r.routed_experts is not None and r.routed_experts.shape == (len(r.response_ids), 2, 2)
            assert all(len(row) == 2 for row in unpack_routes(r.routed_experts))
