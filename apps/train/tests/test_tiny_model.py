"""The project's tiny model: tokenizer properties, determinism, transformers forward, and vLLM CPU loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from arl_train.plan import run_environment
from arl_train.tiny_model import EOS_TOKEN, EXTRA_TOKENS, PAD_TOKEN, SPECIAL_TOKENS, build_tiny_model

DIGITS = "0123456789"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_folder_is_an_ordinary_hf_model_folder(model_dir):
    names = set(_files(model_dir))
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] == 32 and config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 1024 and config["dtype"] == "float32"


def test_vocab_size_and_special_tokens(tokenizer, model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert 900 <= len(tokenizer) <= 1024
    assert config["vocab_size"] == len(tokenizer)
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.pad_token == PAD_TOKEN
    for tok in SPECIAL_TOKENS + EXTRA_TOKENS:
        ids = tokenizer.encode(tok, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == tok
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids(EOS_TOKEN) in gen["eos_token_id"]
    assert config["eos_token_id"] == tokenizer.eos_token_id
    # Specials are skipped when decoding for display; the tool/think markers are kept (as in Qwen).
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|><think>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi<think>"


def test_every_digit_is_one_token_and_digits_never_merge(tokenizer):
    digit_ids = [tokenizer.convert_tokens_to_ids(d) for d in DIGITS]
    assert len(set(digit_ids)) == 10
    for text in ("0123456789", "9876543210 + 1 = 9876543211", "x=42; y=-7.5", " 100000 ", "a1b22c333"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        pieces = tokenizer.convert_ids_to_tokens(ids)
        assert [p for p in pieces if any(c.isdigit() for c in p)] == [c for c in text if c.isdigit()]
    assert not [
        t
        for t in tokenizer.get_vocab()
        if len(t) > 1 and any(c in DIGITS for c in t) and not t.startswith("<")
    ], "no vocabulary entry may hold a digit beside anything else"


def test_round_trip_of_arbitrary_text(tokenizer):
    for text in ("The quick brown fox.", "  spaces\n\nand\ttabs ", "ünïcödé 日本語 🙂", '{"a": [1, 2]}'):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_supports_tools_and_generation_prompt(tokenizer):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate.",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
            ],
        },
        {"role": "tool", "content": "5"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
        tokenize=False,
    )
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    ids = tokenizer.encode(plain, add_special_tokens=False)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2
    assert ids.count(tokenizer.eos_token_id) == 2


def test_transformers_forward_and_tied_embeddings(model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.tensor([tokenizer.encode("12 + 34 = 46", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4 or tokenizer.eos_token_id in out[0, ids.shape[1] :].tolist()


def test_same_seed_gives_identical_files_other_seed_other_weights(model_dir, tmp_path):
    again = _files(build_tiny_model(tmp_path / "again", seed=0))
    assert again == _files(model_dir)
    other = _files(build_tiny_model(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in again.items() if k != "model.safetensors"
    }, "the tokenizer and configs do not depend on the seed"


@pytest.mark.slow
def test_identical_files_from_another_process(model_dir, tmp_path):
    # Another interpreter with another hash seed: catches any dependence on dict/set order or Rust hashing.
    out = tmp_path / "proc"
    code = f"from arl_train.tiny_model import build_tiny_model; build_tiny_model({str(out)!r}, seed=0)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600, capture_output=True)
    assert _files(out) == _files(model_dir)


_VLLM_PROBE = textwrap.dedent(
    """
    import json, sys, time


    def main(model_dir, prompts_path, out_path):
        t0 = time.time()
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        t1 = time.time()
        llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
                  max_model_len=512, seed=0)
        t2 = time.time()
        prompts = json.load(open(prompts_path))
        params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0, prompt_logprobs=0, ignore_eos=True)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        t3 = time.time()
        results = []
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            prompt_lp = [None if d is None else d[t].logprob for t, d in zip(p, o.prompt_logprobs)]
            results.append({"prompt_logprobs": prompt_lp, "token_ids": list(c.token_ids),
                            "logprobs": [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)],
                            "text": c.text})
        with open(out_path, "w") as f:
            json.dump({"import_s": t1 - t0, "init_s": t2 - t1, "generate_s": t3 - t2, "results": results}, f)


    if __name__ == "__main__":
        main(*sys.argv[1:4])
    """
)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.exhaustive(
    reason="every vLLM app run checks the engine's log probs against the trainer's on this model "
    "(probe_logprob_max_abs_diff: tests/test_train_colocated.py, tests/test_train_e2e.py)"
)
def test_vllm_cpu_loads_it_and_agrees_with_transformers(model_dir, tokenizer, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 17 + 25?"}], add_generation_prompt=True, tokenize=False
        ),
        "Reverse the digits: 9081726354",
        "The quick brown fox jumps over the lazy dog.",
    ]
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    (tmp_path / "prompts.json").write_text(json.dumps(prompt_ids))
    script = tmp_path / "vllm_probe.py"
    script.write_text(_VLLM_PROBE)
    # The app's caches (outside $HOME, kept across runs: arl_train.plan.run_environment): vLLM stores there
    # what it learned by inspecting the architecture in a subprocess (~17 CPU-s saved on every later start).
    caches = run_environment(tmp_path)
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", caches["VLLM_CACHE_ROOT"]),
        "HF_HOME": os.environ.get("HF_HOME", caches["HF_HOME"]),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(model_dir),
            str(tmp_path / "prompts.json"),
            str(tmp_path / "out.json"),
        ],
        env=env,
        cwd=tmp_path,
        timeout=800,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads((tmp_path / "out.json").read_text())
    print(
        f"vLLM import {out['import_s']:.1f}s, LLM init {out['init_s']:.1f}s, generate {out['generate_s']:.2f}s"
    )

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    worst = 0.0
    for ids, res in zip(prompt_ids, out["results"]):
        assert len(res["token_ids"]) == 8
        full = torch.tensor([ids + res["token_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0], dim=-1)
        ref = [logp[i, full[0, i + 1]].item() for i in range(full.shape[1] - 1)]
        got = res["prompt_logprobs"][1:] + res["logprobs"]
        assert res["prompt_logprobs"][0] is None and len(got) == len(ref)
        worst = max(worst, max(abs(a - b) for a, b in zip(ref, got)))
        # Greedy decoding picks transformers' argmax at every step (up to float ties).
        for k, token in enumerate(res["token_ids"]):
            step = logp[len(ids) - 1 + k]
            assert step[token] >= step.max() - 1e-4
    print(f"max |logprob(vLLM) - logprob(transformers)| = {worst:.2e}")
    assert worst < 1e-3


def test_large_shapes_draw_their_weights_like_transformers_once_and_deterministically(tmp_path):
    """The bfloat16 path of the built-in large shapes (arl_train.random_init), on a small body: the
    same tensors as transformers' own init would make (names, shapes, tied head), drawn N(0, 0.02) with
    the padding row zero and norms 1; the same seed gives identical files whatever the thread count,
    another seed other weights; transformers loads it and its forward is finite."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from arl_train.random_init import random_causal_lm

    shape = dict(
        hidden_size=256,
        intermediate_size=768,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype="bfloat16",
    )
    first = build_tiny_model(tmp_path / "a", seed=3, **shape)
    again = build_tiny_model(tmp_path / "b", seed=3, **shape)
    other = build_tiny_model(tmp_path / "c", seed=4, **shape)
    assert (
        _files(first) == _files(again)
        and _files(first)["model.safetensors"] != _files(other)["model.safetensors"]
    )

    config = Qwen3Config.from_pretrained(first)
    one_thread = random_causal_lm(Qwen3ForCausalLM, config, torch.bfloat16, seed=3, threads=1)
    many = random_causal_lm(Qwen3ForCausalLM, config, torch.bfloat16, seed=3, threads=4)
    reference = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)
    assert {k: (v.shape, v.dtype) for k, v in many.state_dict().items()} == {
        k: (v.shape, v.dtype) for k, v in reference.state_dict().items()
    }
    assert all(
        torch.equal(a, b)
        for a, b in zip(one_thread.state_dict().values(), many.state_dict().values(), strict=True)
    )
    assert many.lm_head.weight is many.model.embed_tokens.weight
    embed = many.model.embed_tokens.weight.float()
    assert (embed[config.pad_token_id] == 0).all()
    up = many.model.layers[1].mlp.up_proj.weight.float()
    assert (
        up.std().item() == pytest.approx(config.initializer_range, rel=0.02) and abs(up.mean().item()) < 1e-3
    )
    assert all((p == 1).all() for n, p in many.named_parameters() if "norm" in n)

    model = AutoModelForCausalLM.from_pretrained(first, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all()
