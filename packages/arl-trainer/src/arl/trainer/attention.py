"""Variable-length (packed) causal attention for transformers models, from what torch itself ships.

`register()` adds the implementation "arl_varlen" to transformers' `AttentionInterface`. A packed
micro-batch is one row of concatenated sequences; the model is called with `cu_seq_lens_q/k` and
`max_length_q/k` (transformers forwards those keyword arguments to the attention function) and no
attention mask (transformers builds none for an implementation it has no mask function for).

- CUDA, fp16/bf16, torch with `torch.nn.attention.varlen.varlen_attn`: one fused flash kernel over
  the packed tokens (no flash-attn build needed).
- Elsewhere (CPU, fp32, older torch): scaled_dot_product_attention per sequence with is_causal —
  exactly block-diagonal causal attention, never a T×T mask.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

IMPLEMENTATION = "arl_varlen"


@lru_cache(maxsize=1)
def _varlen() -> tuple[Any, frozenset[str]] | None:
    """torch's varlen_attn and its keyword names, or None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def fused_available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and _varlen() is not None


def varlen_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    """Causal attention over packed sequences. q (T, Hq, D), k/v (T, Hkv, D), cu (n+1,) int32 → (T, Hq, D)."""
    fused = _varlen() if fused_available(q.device, q.dtype) else None
    if fused is not None:
        fn, params = fused
        kwargs: dict[str, Any] = {}
        if "scale" in params:
            kwargs["scale"] = scale
        if "window_size" in params:  # torch ≥ 2.12 spells causal as a (-1, 0) window
            kwargs["window_size"] = (-1, 0)
        else:
            kwargs["is_causal"] = True
        if q.shape[1] != k.shape[1]:
            if "enable_gqa" in params:
                kwargs["enable_gqa"] = True
            else:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        cu = cu.to(device=q.device, dtype=torch.int32)
        out = fn(q, k, v, cu, cu, max_len, max_len, **kwargs)
        return out[0] if isinstance(out, tuple) else out
    return _per_sequence_sdpa(q, k, v, cu, scale)


def _per_sequence_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float | None
) -> torch.Tensor:
    bounds = cu.tolist()
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        # (1, H, s, D): SDPA's fused kernels take 4-D inputs only; 3-D ones fall back to the math kernel,
        # which builds the s×s matrix (~5× slower at 4.4k tokens on the CPU: packed_attention_cpu.py).
        qs, ks, vs = (t[start:end].transpose(0, 1)[None] for t in (q, k, v))
        if gqa:
            rep = qs.shape[1] // ks.shape[1]
            ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs, dim=0)


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query (1, Hq, T, D), key/value (1, Hkv, T, D) → (1, T, Hq, D)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        # An ordinary call (no packing): each row is one unpadded sequence.
        if attention_mask is not None:
            raise ValueError(
                f"{IMPLEMENTATION} takes packed rows (cu_seq_lens_q) or unpadded rows, not a padding mask"
            )
        gqa = {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, **gqa)
        return out.transpose(1, 2).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError(f"{IMPLEMENTATION} needs one packed row, got {query.shape[0]}")
    max_len = kwargs.get("max_length_q")
    max_len = int(max_len) if max_len is not None else int((cu[1:] - cu[:-1]).max())
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D)
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        # RoPE against an fp32 residual stream yields fp32 q/k under autocast; attention runs in the
        # autocast dtype (as SDPA would), which is also what the fused kernel needs.
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out = varlen_causal(q.contiguous(), k.contiguous(), v.contiguous(), cu, max_len, scaling)
    return out.unsqueeze(0), None


def register() -> str:
    """Register the implementation with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, varlen_attention_forward)
    return IMPLEMENTATION
