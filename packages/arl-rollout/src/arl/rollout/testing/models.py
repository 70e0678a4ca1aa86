"""Small random models saved as Hugging Face folders (no tokenizer, no download), and reference log
probs from transformers, for checking engines exactly (torch and transformers are imported on call)."""

from __future__ import annotations

from typing import Any


def save_random_qwen3(path: Any, *, vocab: int, hidden: int, head_dim: int, max_positions: int) -> Any:
    """A random 2-layer Qwen3 (tied embeddings, seed 0) saved as an HF folder, without a tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def hf_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """Log probs of `tokens` after `prompt` under a transformers model (the reference for engines)."""
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def save_random_qwen3_moe(
    path: Any,
    *,
    vocab: int = 256,
    hidden: int = 64,
    head_dim: int = 32,
    layers: int = 2,
    experts: int = 8,
    top_k: int = 2,
    max_positions: int = 512,
    router_std: float = 0.02,
    seed: int = 0,
) -> Any:
    """A random Qwen3-MoE (every layer sparse, tied embeddings) saved as an HF folder, without a tokenizer.
    `router_std` sets the router weights' spread: larger means fewer near-ties between experts."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, router_std)
    model.save_pretrained(path)
    return path
