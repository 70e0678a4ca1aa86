"""arl's in-tree TorchEngine: exact log probs, batched sampling, abort/resume, staged weight loads."""

import asyncio

import msgspec
import pytest
import torch

from arl.proxy.types import SamplingParams
from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig, sample
from arl.rollout.testing import hf_logprobs, save_random_qwen3
from arl.sync import SyncConfig, WeightSender


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen3(
        tmp_path_factory.mktemp("qwen3"), vocab=128, hidden=32, head_dim=16, max_positions=256
    )


def test_sample_respects_top_k_top_p_and_reports_processed_logprobs():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logp = sample(logits, 1.0, 1.0, 2, gen)
    assert set(tokens.tolist()) == {0, 1}
    expected = torch.log_softmax(torch.tensor([4.0, 3.0]), -1)
    assert torch.allclose(logp, expected[tokens], atol=1e-6)
    probs = torch.softmax(logits[0], -1)  # 0.64, 0.24, 0.09, ...: top_p 0.8 keeps the first two
    tokens, _ = sample(logits, 1.0, 0.8, -1, gen)
    assert set(tokens.tolist()) == {0, 1} and probs[:2].sum() > 0.8
    tokens, logp = sample(logits[:3], 0.0, 1.0, -1, gen)
    assert tokens.tolist() == [0, 0, 0]


# On CUDA the engine decodes on the GPU while the reference stays on the CPU: the same float32 model.
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_engine_generates_with_exact_logprobs_aborts_and_loads_weights(model_dir, device):
    from transformers import AutoModelForCausalLM

    engine = TorchEngine(TorchEngineConfig(model_path=str(model_dir), device=device))
    await engine.start()
    config = SyncConfig(transport="cpu", timeout_s=30)
    sender = WeightSender(config, num_receivers=1)
    try:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
        outs = await asyncio.gather(
            *(
                engine.generate(f"r{i}", p, SamplingParams(max_tokens=6, temperature=0.7))
                for i, p in enumerate(prompts)
            )
        )
        for p, out in zip(prompts, outs, strict=True):  # batched with left padding, still exact
            assert out.stop_reason == "length" and len(out.token_ids) == 6
            ref = hf_logprobs(hf, p, out.token_ids, temperature=0.7)
            assert max(abs(a - b) for a, b in zip(out.log_probs, ref, strict=True)) < 1e-4
        a = await engine.generate("s1", [1, 2], SamplingParams(max_tokens=8, seed=7))
        b = await engine.generate("s2", [1, 2], SamplingParams(max_tokens=8, seed=7))
        assert a.token_ids == b.token_ids  # a request's own seed makes it reproducible

        long = asyncio.create_task(engine.generate("long", [1], SamplingParams(max_tokens=10_000)))
        await asyncio.sleep(0.2)
        await engine.pause("abort")
        partial = await asyncio.wait_for(long, 10)
        assert partial.stop_reason == "abort" and 0 < len(partial.token_ids) < 10_000
        assert len(partial.log_probs) == len(partial.token_ids)

        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        send = asyncio.to_thread(sender.send, list(hf.named_parameters()), 1)
        await asyncio.gather(send, engine.load_weights(sender.address, msgspec.json.encode(config), 1))
        await engine.resume()
        out = await engine.generate("after", [1, 2, 3], SamplingParams(max_tokens=5))
        assert out.weight_versions == [1] * 5
        ref = hf_logprobs(hf, [1, 2, 3], out.token_ids)
        assert max(abs(x - y) for x, y in zip(out.log_probs, ref, strict=True)) < 1e-4
    finally:
        sender.close()
        await engine.stop()


async def test_a_cancelled_generate_stops_decoding_its_request(model_dir):
    engine = TorchEngine(TorchEngineConfig(model_path=str(model_dir)))
    await engine.start()
    try:
        call = asyncio.create_task(engine.generate("r0", [1, 2, 3], SamplingParams(max_tokens=100_000)))
        while engine.in_flight == 0:
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert engine.in_flight == 0
        out = await engine.generate("r1", [1, 2, 3], SamplingParams(max_tokens=3))  # the engine serves on
        assert len(out.token_ids) == 3
    finally:
        await engine.stop()
