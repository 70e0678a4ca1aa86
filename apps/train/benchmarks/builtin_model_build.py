"""Benchmark: building a large built-in shape (`builtin:qwen3-*-random`), arl's random init vs transformers'.

    python apps/train/benchmarks/builtin_model_build.py [--shape qwen3-1.7b-random] [--full qwen3-8b-random]

Side by side in one process on the same CPU: `arl_train.random_init.random_causal_lm` (meta build,
one N(0, 0.02) draw per tensor on every core) against `Qwen3ForCausalLM._from_config` (transformers'
init) for `--shape`, in bfloat16, seconds each and the ratio; then, with `--full`, the whole
`build_builtin_model` of that shape (tokenizer, weights, safetensors write) timed alone. One JSON
block; $OUT/builtin_model_build.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402


def main() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from arl_train.random_init import random_causal_lm
    from arl_train.tiny_model import MODEL_SHAPES, build_builtin_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen3-1.7b-random")
    p.add_argument("--full", default="")
    args = p.parse_args()
    s = MODEL_SHAPES[args.shape]
    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_layers"],
        num_attention_heads=s["num_heads"],
        num_key_value_heads=s["num_kv_heads"],
        head_dim=s["head_dim"],
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    result: dict = {"shape": args.shape, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    t = time.perf_counter()
    model = random_causal_lm(Qwen3ForCausalLM, config, torch.bfloat16, seed=0)
    result["arl_init_s"] = time.perf_counter() - t
    result["params_b"] = sum(x.numel() for x in model.parameters()) / 1e9
    del model
    t = time.perf_counter()
    model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)
    result["transformers_init_s"] = time.perf_counter() - t
    del model
    result["transformers_over_arl"] = result["transformers_init_s"] / result["arl_init_s"]
    if args.full:
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            build_builtin_model(args.full, Path(d) / "model")
            result[f"build_{args.full}_s"] = time.perf_counter() - t
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "builtin_model_build.json").write_text(text)


if __name__ == "__main__":
    main()
