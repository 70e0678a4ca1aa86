"""Model-shaped state dicts for the benchmarks (no download: shapes only, random contents)."""

from __future__ import annotations

import torch

# Qwen2.5-0.5B: hidden 896, intermediate 4864, 24 layers, 14 query heads / 2 kv heads of 64, vocab 151936,
# tied embeddings (no lm_head tensor).
QWEN25_05B = dict(hidden=896, inter=4864, layers=24, heads=14, kv_heads=2, head_dim=64, vocab=151936)
# Qwen2.5-7B: untied embeddings (an lm_head tensor too).
QWEN25_7B = dict(hidden=3584, inter=18944, layers=28, heads=28, kv_heads=4, head_dim=128, vocab=152064)
MODELS = {"0.5b": (QWEN25_05B, True), "7b": (QWEN25_7B, False)}


def qwen_shapes(
    hidden: int, inter: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int
) -> list[tuple[str, tuple[int, ...]]]:
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (q, hidden)),
            (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, q)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    shapes.append(("model.norm.weight", (hidden,)))
    return shapes


def make_state_dict(
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    scale: float = 1.0,
    seed: int = 0,
    model: str = "0.5b",
) -> dict[str, torch.Tensor]:
    """A Qwen2.5-shaped state dict (`scale` < 1 shrinks the layer count for quick runs)."""
    base, tied = MODELS[model]
    cfg = dict(base)
    cfg["layers"] = max(1, round(cfg["layers"] * scale))
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    shapes = qwen_shapes(**cfg)
    if not tied:
        shapes.append(("lm_head.weight", (cfg["vocab"], cfg["hidden"])))
    for name, shape in shapes:
        out[name] = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    return out


def total_bytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())
