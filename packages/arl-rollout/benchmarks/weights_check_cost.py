"""What an end-of-run weights check costs: fingerprints (`weights_digest`) vs moving the tensors.

    uv run python packages/arl-rollout/benchmarks/weights_check_cost.py [--model 0.5b|7b] [--device cpu|cuda]

The trainer side is a Qwen2.5-shaped bf16 state dict (HF names); the engine side is the same weights
laid out as vLLM lays them out at TP 1 (q/k/v and gate/up fused, the vocabulary padded to a multiple
of 64). Measured in one run, each side of each check timed separately:

* tensors (the check the app ran before): each side serialises its tensors to safetensors bytes (what
  crossed Ray and vLLM's RPC), the other end loads them, `compare_weights` compares them.
* digests (the app's check now): the engine digests its tensors where they live (`engine_digests`),
  the trainer streams its tensors through `compare_digests`; a few integers per tensor travel.

Also the rate of one plain copy of the same bytes on the device, as the reference for "memory-bound".
Prints JSON; writes $OUT/weights_check_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arl-sync" / "benchmarks"))
from model_shapes import make_state_dict, total_bytes  # noqa: E402

from arl.rollout.engines.weights_check import compare_weights  # noqa: E402
from arl.rollout.engines.weights_digest import compare_digests, engine_digests  # noqa: E402

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def vllm_layout(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The engine's tensors at TP 1: fused projections, vocabulary rows padded to a multiple of 64."""
    out: dict[str, torch.Tensor] = {}
    for name, t in hf.items():
        fused = next((f for f, parts in FUSED.items() if f".{parts[0]}." in name), None)
        if fused is not None:
            out[name.replace(FUSED[fused][0], fused)] = torch.cat(
                [hf[name.replace(FUSED[fused][0], p)] for p in FUSED[fused]]
            )
        elif not any(f".{p}." in name for parts in FUSED.values() for p in parts[1:]):
            if "embed_tokens" in name or "lm_head" in name:
                padded = -(-t.shape[0] // 64) * 64
                t = torch.cat(
                    [t, torch.zeros(padded - t.shape[0], *t.shape[1:], dtype=t.dtype, device=t.device)]
                )
            out[name] = t.clone()
    return out


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    value = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return value, time.perf_counter() - t


def main(args: argparse.Namespace) -> dict:
    from safetensors.torch import load, save

    hf = make_state_dict(torch.bfloat16, device=args.device, model=args.model)
    engine = vllm_layout(hf)
    nbytes = total_bytes(hf)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=args.device)
    _, copy_s = timed(flat.clone)
    del flat

    # The tensor check: serialise on each side, load at the checker, compare.
    engine_blob, engine_save_s = timed(lambda: save({n: t.cpu().contiguous() for n, t in engine.items()}))
    trainer_blob, trainer_save_s = timed(lambda: save({n: t.cpu().contiguous() for n, t in hf.items()}))
    (engine_back, trainer_back), load_s = timed(lambda: (load(engine_blob), load(trainer_blob)))
    tensor_result, compare_s = timed(lambda: compare_weights(trainer_back, engine_back))

    # The digest check: the engine digests in place, the trainer streams through the comparison.
    digests, engine_digest_s = timed(lambda: engine_digests(engine.items()))
    digest_bytes = len(json.dumps([[d.shape, d.dtype, d.digest, d.rows] for d in digests.values()]))
    digest_result, trainer_digest_s = timed(lambda: compare_digests(iter(hf.items()), [digests]))

    tensors_s = engine_save_s + trainer_save_s + load_s + compare_s
    digests_s = engine_digest_s + trainer_digest_s
    return {
        "benchmark": "weights_check_cost",
        "model": args.model,
        "device": args.device,
        "trainer_bytes": nbytes,
        "engine_tensors": len(engine),
        "copy_gbps": nbytes / copy_s / 1e9,
        "tensors": {
            "equal": tensor_result["equal"],
            "moved_bytes": len(engine_blob) + len(trainer_blob),
            "engine_save_s": engine_save_s,
            "trainer_save_s": trainer_save_s,
            "load_s": load_s,
            "compare_s": compare_s,
            "total_s": tensors_s,
        },
        "digests": {
            "equal": digest_result["equal"],
            "moved_bytes": digest_bytes,
            "engine_s": engine_digest_s,
            "trainer_s": trainer_digest_s,
            "total_s": digests_s,
            "engine_gbps": nbytes / engine_digest_s / 1e9,
        },
        "digests_over_tensors_time": digests_s / tensors_s,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="0.5b", choices=["0.5b", "7b"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    result = main(ap.parse_args())
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "weights_check_cost.json").write_text(text)
