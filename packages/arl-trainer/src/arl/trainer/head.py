"""The chunked log-prob / entropy head: log π(target) and entropy at the loss positions only.

The full-vocabulary logits of a long packed micro-batch are the largest tensor of an LLM step
(8k tokens × 152k vocabulary × 4 bytes = 5 GB in fp32). This head takes the hidden states of the
positions that are trained on, and for chunks of them computes logits → log-softmax → the target's
log prob and the entropy, keeping only three floats per token. Backward recomputes each chunk's
logits (a custom autograd.Function), so neither pass ever holds more than one chunk of logits.
The reductions run in fp32 whatever the compute dtype; the two matmuls run in the input dtype.
"""

from __future__ import annotations

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
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.empty(n, dtype=acc, device=hidden.device)
        lse_all = torch.empty(n, dtype=acc, device=hidden.device)
        for s in range(0, n, chunk_rows):
            e = min(n, s + chunk_rows)
            z = (hidden[s:e] @ weight.t()).to(acc) / temperature
            lse = torch.logsumexp(z, dim=-1)
            logp_all = z - lse[:, None]
            logp[s:e] = logp_all.gather(1, targets[s:e, None]).squeeze(1)
            entropy[s:e] = -(torch.exp(logp_all) * logp_all).sum(-1)
            lse_all[s:e] = lse
        ctx.save_for_backward(hidden, weight, targets, lse_all, entropy)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):  # type: ignore[override]
        hidden, weight, targets, lse_all, entropy = ctx.saved_tensors
        t, n = ctx.temperature, hidden.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = lse_all.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        if grad_logp is None:
            grad_logp = torch.zeros(n, dtype=acc, device=hidden.device)
        if grad_entropy is None:
            grad_entropy = torch.zeros(n, dtype=acc, device=hidden.device)
        for s in range(0, n, ctx.chunk_rows):
            e = min(n, s + ctx.chunk_rows)
            z = (hidden[s:e] @ weight.t()).to(acc) / t
            logp_all = z - lse_all[s:e, None]
            p = torch.exp(logp_all)
            # d logp_target / dz = onehot − p;  d entropy / dz = −p (log p + H)
            dz = -p * (grad_logp[s:e, None] + grad_entropy[s:e, None] * (logp_all + entropy[s:e, None]))
            dz.scatter_add_(1, targets[s:e, None], grad_logp[s:e, None].to(acc))
            dz = (dz / t).to(hidden.dtype)
            if need_h:
                grad_h[s:e] = dz @ weight
            if need_w:
                grad_w += (dz.t() @ hidden[s:e]).to(acc)
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(targets), entropy), both (N,) in fp32 (fp64 for fp64 input), from hidden (N, d) and the LM head weight (V, d).

    Equal to `log_softmax(hidden @ weight.T / temperature)` picked at `targets` (and its entropy),
    gradients included, without materialising the (N, V) logits outside one chunk.
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do not match (N, d) and (V, d)")
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
