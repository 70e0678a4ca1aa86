"""A Triton kernel for the log-prob head's reduction: logsumexp and entropy of each row of a logits chunk.

The head's forward reads every chunk of logits (≈900 rows × 152k vocabulary at the 0.5B shape) once to
reduce it. Inductor's compiled reduction of that pass ran at ~0.3 TB/s on an H200 (a 152k-wide row per
reduction is not a shape it tiles well), an order below what a single read costs. This kernel reads
the chunk once at memory speed: each program walks one segment of one row in blocks, keeping the
running maximum m, s = Σ exp(x − m) and t = Σ exp(x − m)·x (online-softmax rescaling when m grows);
a few tiny tensor ops then combine the segments of a row into

    lse = M + log S,   H = lse − T / S      (M, S, T: the segments' m, s, t brought to the row's peak)

Inputs are bf16/fp16/fp32 logits; everything is accumulated in fp32. `logit_stats` has the same
contract as `head._logit_stats` and is chosen over it on CUDA when Triton is importable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements of a row each program reads per loop iteration (with 8 warps: 16 per thread).
_BLOCK = 4096
# Enough programs to keep every SM streaming; short chunks (the tail of a micro-batch) split their
# rows into more segments to get there.
_TARGET_PROGRAMS = 1024


@triton.jit
def _segment_stats(z_ptr, row_stride, vocab, seg_len, inv_t, m_ptr, s_ptr, t_ptr, num_segments,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    lo = seg * seg_len
    hi = tl.minimum(lo + seg_len, vocab)
    base = z_ptr + row.to(tl.int64) * row_stride
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    t = tl.zeros((), tl.float32)
    for start in range(lo, hi, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < hi
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.max(x, axis=0))
        e = tl.exp(x - m_new)  # 0 where masked
        rescale = tl.exp(m - m_new)  # 0 on the first block (m = −inf)
        s = s * rescale + tl.sum(e, axis=0)
        t = t * rescale + tl.sum(tl.where(mask, e * x, 0.0), axis=0)
        m = m_new
    out = row * num_segments + seg
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)
    tl.store(t_ptr + out, t)


def _num_segments(rows: int, vocab: int) -> int:
    want = max(1, -(-_TARGET_PROGRAMS // rows))
    return max(1, min(want, vocab // _BLOCK))


def logit_stats(z: torch.Tensor, inv_t: float, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, entropy) per row of `z` (n, V) scaled by `inv_t`, in `acc` (fp32 or wider)."""
    if z.stride(1) != 1:
        z = z.contiguous()
    n, vocab = z.shape
    k = _num_segments(n, vocab)
    seg_len = -(-vocab // k)
    parts = torch.empty(3, n, k, dtype=torch.float32, device=z.device)
    _segment_stats[(n, k)](z, z.stride(0), vocab, seg_len, float(inv_t), parts[0], parts[1], parts[2], k,
                           BLOCK=_BLOCK, num_warps=8)
    m, s, t = parts.to(acc)
    peak = m.amax(-1, keepdim=True)
    scale = torch.exp(m - peak)
    total = (s * scale).sum(-1)
    dot = (t * scale).sum(-1)
    lse = peak.squeeze(-1) + torch.log(total)
    return lse, lse - dot / total
