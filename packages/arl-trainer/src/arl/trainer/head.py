"""The chunked log-prob / entropy head: log π(target) and entropy at the loss positions only.

The full-vocabulary logits of a long packed micro-batch are the largest tensor of an LLM step
(8k tokens × 152k vocabulary × 4 bytes = 5 GB in fp32). This head takes the hidden states of the
positions that are trained on, and for chunks of them computes logits → log-softmax → the target's
log prob and the entropy, keeping only three floats per token. Backward recomputes each chunk's
logits (a custom autograd.Function), so neither pass ever holds more than one chunk of logits.
The reductions run in fp32 whatever the compute dtype; the two matmuls run in the input dtype.

Per chunk, forward is one matmul and one pass over its logits (logsumexp and entropy); backward is the
recomputing matmul, one pass that forms the logits' gradient, and the two matmuls of the gradient (the
weight's accumulated in fp32 by the GEMM itself). On CUDA each pass is one Triton kernel (`head_triton.py`).
"""

from __future__ import annotations

import warnings

import torch

# Logit elements per chunk (tokens × vocabulary): 2^27 fp32 values = 512 MiB.
DEFAULT_CHUNK_ELEMENTS = 1 << 27


def _chunk_rows(vocab: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // vocab)


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_rows):  # type: ignore[override]
        n = hidden.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 reductions at least
        inv_t = 1.0 / temperature
        stats, _ = _kernels(hidden.device, acc)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        for s in range(0, n, chunk_rows):
            rows, tgt = slice(s, min(n, s + chunk_rows)), targets[s : s + chunk_rows, None]
            z = hidden[rows] @ weight.t()
            lse[rows], entropy[rows] = stats(z, inv_t, acc)
            logp[rows] = z.gather(1, tgt).squeeze(1).to(acc) * inv_t - lse[rows]
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.inv_t = inv_t
        ctx.chunk_rows = chunk_rows
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        inv_t, n = ctx.inv_t, hidden.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        acc = lse.dtype
        _, dlogits = _kernels(hidden.device, acc)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        g_logp = torch.zeros(n, dtype=acc, device=hidden.device) if grad_logp is None else grad_logp.to(acc)
        g_ent = (
            torch.zeros(n, dtype=acc, device=hidden.device) if grad_entropy is None else grad_entropy.to(acc)
        )
        # dz = (onehot·g_logp − p·(g_logp + g_ent·(log p + H))) / t = p·(a + b·log p) off the target,
        # with a = −(g_logp + g_ent·H)/t and b = −g_ent/t per row, and c = g_logp/t added at the target.
        a = -(g_logp + g_ent * entropy) * inv_t
        b = -g_ent * inv_t
        c = g_logp * inv_t
        for s in range(0, n, ctx.chunk_rows):
            rows = slice(s, min(n, s + ctx.chunk_rows))
            z = hidden[rows] @ weight.t()
            dz = dlogits(z, lse[rows], a[rows], b[rows], c[rows], targets[rows], inv_t)
            if need_h:
                grad_h[rows] = dz @ weight
            if need_w:
                _accumulate_fp32(grad_w, dz.t(), hidden[rows])
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None


def _logit_stats(z: torch.Tensor, inv_t: float, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, entropy) per row of one chunk's logits `z` (scaled by 1/temperature), in `acc`.

    Each row is reduced in `k` segments first and the segments combined after (a two-stage softmax
    reduction): a whole 152k-wide row per GPU program leaves too few programs to saturate memory."""
    n, vocab = z.shape
    k = _segments(vocab)
    zf = z.to(acc).view(n, k, vocab // k) * inv_t
    seg_peak = zf.amax(-1, keepdim=True)
    e = torch.exp(zf - seg_peak)
    seg_peak = seg_peak.squeeze(-1)
    peak = seg_peak.amax(-1, keepdim=True)
    scale = torch.exp(seg_peak - peak)  # (n, k): brings each segment's sums to the row's peak
    total = (e.sum(-1) * scale).sum(-1)
    dot = ((e * zf).sum(-1) * scale).sum(-1)
    lse = peak.squeeze(-1) + torch.log(total)
    return lse, lse - dot / total  # H = −Σ p (z − lse) = lse − Σ p z


def _segments(vocab: int, most: int = 16) -> int:
    """The largest power of two ≤ `most` that divides `vocab` (vocabularies are padded to multiples of 64+)."""
    k = most
    while vocab % k:
        k //= 2
    return k


def _logit_grads(
    z: torch.Tensor, lse: torch.Tensor, a: torch.Tensor, b: torch.Tensor, inv_t: float, acc: torch.dtype
) -> torch.Tensor:
    """p·(a + b·log p) per logit of one chunk, in `acc`, stored in z's dtype."""
    logp = z.to(acc) * inv_t - lse[:, None]
    return (torch.exp(logp) * (a[:, None] + b[:, None] * logp)).to(z.dtype)


def _logit_grads_with_target(
    z: torch.Tensor,
    lse: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    targets: torch.Tensor,
    inv_t: float,
) -> torch.Tensor:
    """The logits' gradient of one chunk in z's dtype: p·(a + b·log p) per logit, plus c at each row's
    target."""
    acc = lse.dtype
    tgt = targets[:, None]
    dz = _logit_grads(z, lse, a, b, inv_t, acc)
    # The target's entry in fp32: p_t·(a + b·log p_t) + g_logp/t cancels as p_t → 1, which bf16
    # would lose.
    logp_t = z.gather(1, tgt).squeeze(1).to(acc) * inv_t - lse
    at_target = torch.exp(logp_t) * (a + b * logp_t) + c
    dz.scatter_(1, tgt, at_target[:, None].to(dz.dtype))
    return dz


_CUDA_KERNELS: dict[str, tuple] = {}


def _kernels(device: torch.device, acc: torch.dtype) -> tuple:
    """The two per-chunk passes over the logits (stats, grads): on CUDA each one Triton kernel that reads
    the chunk's logits once (and the gradient pass writes its result once), eager elsewhere. With a small
    hidden size (0.5B: 896 against a 152k vocabulary) these passes, not the matmuls, set the head's speed:
    eager, each operator is a pass over the chunk in fp32."""
    if device.type != "cuda" or acc == torch.float64:  # (the Triton kernels reduce in fp32)
        return _logit_stats, _logit_grads_with_target
    if "cuda" not in _CUDA_KERNELS:
        try:
            from arl.trainer.head_triton import logit_grads, logit_stats

            _CUDA_KERNELS["cuda"] = (logit_stats, logit_grads)
        except ImportError:
            warnings.warn(
                "triton is not installed: the log-prob head runs eagerly (slower; same results)", stacklevel=3
            )
            _CUDA_KERNELS["cuda"] = (_logit_stats, _logit_grads_with_target)
    return _CUDA_KERNELS["cuda"]


def _accumulate_fp32(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b, with `out` fp32 and a, b possibly bf16/fp16: one GEMM that accumulates into `out`
    where the device has it (CUDA's addmm with out_dtype), else the product cast and added."""
    if a.dtype != out.dtype and _addmm_out_dtype_works(out.device):
        torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
    else:
        out += (a @ b).to(out.dtype)


_ADDMM_OUT_DTYPE: dict[torch.device, bool] = {}


def _addmm_out_dtype_works(device: torch.device) -> bool:
    if device not in _ADDMM_OUT_DTYPE:
        try:
            x = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
            acc = torch.ones(2, 2, dtype=torch.float32, device=device)
            torch.addmm(acc, x, x, out_dtype=torch.float32, out=acc)
            _ADDMM_OUT_DTYPE[device] = bool((acc == 3).all())
        except (RuntimeError, TypeError, NotImplementedError):
            _ADDMM_OUT_DTYPE[device] = False
    return _ADDMM_OUT_DTYPE[device]


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(targets), entropy), both (N,) in fp32 (fp64 for fp64 input), from hidden (N, d) and the LM
    head weight (V, d).

    Equal to `log_softmax(hidden @ weight.T / temperature)` picked at `targets` (and its entropy),
    gradients included, without materialising the (N, V) logits outside one chunk.
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do not match (N, d) and (V, d)"
        )
    if hidden.shape[0] == 0:
        zero = hidden.sum() * 0.0 + weight.sum() * 0.0  # keeps both in the graph (FSDP expects every grad)
        empty = torch.zeros(0, dtype=torch.float32, device=hidden.device) + zero.float()
        return empty, empty
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        # Under autocast both matmuls run in the autocast dtype, forward and backward alike.
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    with torch.autocast(device_type, enabled=False):
        return _ChunkedLogProbs.apply(
            hidden, weight, targets, float(temperature), _chunk_rows(weight.shape[0], chunk_elements)
        )
