"""Model FLOPs for MFU, by the convention in the package README.

Training FLOPs of a micro-batch = 6·N_matmul·T + 6·Σ_seq s²·d_attn·L: N_matmul counts the weights of
every linear layer (the LM head included, the embedding lookup not), T the tokens, s each sequence's
length, d_attn = heads × head_dim, L the layers; forward + backward, recomputation not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def matmul_params(model: torch.nn.Module) -> int:
    """Weights of all nn.Linear modules (a tied LM head counts: it is a matmul)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def attention_width_and_layers(config: object) -> tuple[int, int]:
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return heads * int(head_dim), int(config.num_hidden_layers)


def train_flops(n_matmul: int, seq_lengths: Sequence[int], attn_width: int, layers: int) -> float:
    tokens = sum(seq_lengths)
    return 6.0 * n_matmul * tokens + 6.0 * sum(s * s for s in seq_lengths) * attn_width * layers
