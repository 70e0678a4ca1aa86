"""Triton kernels for the log-prob head's two per-chunk passes over the logits.

`logit_stats` (forward): logsumexp and entropy of each row of a logits chunk. The head's forward reads
every chunk of logits (≈900 rows × 152k vocabulary at the 0.5B shape) once to reduce it. Inductor's
compiled reduction of that pass moved 0.6–0.8 TB/s on an H200 (`chunk_passes` in head_memory.py; a
152k-wide row per reduction is not a shape it tiles well). This kernel reads the chunk once: each
program walks a row (or, for a short chunk, one segment of a row) in blocks, keeping the running
maximum m, s = Σ exp(x − m) and t = Σ exp(x − m)·x (online-softmax rescaling when m grows), and
ends with

    lse = M + log S,   H = lse − T / S      (M, S, T: the segments' m, s, t brought to the row's peak)

`logit_grads` (backward): the logits' gradient of a chunk, given each row's lse and the coefficients
a, b, c the head derives from the incoming gradients,

    dz = p·(a + b·log p)  (+ c at the row's target),   log p = z/t − lse,

read once and written once (Inductor's compiled version of the pass moved ~1.1–1.3 TB/s on an H200, a
third of a device copy, and the target's entry then needed a gather and a scatter besides). It is
elementwise, so each program takes one block of one row. The target's entry is formed in fp32 before
the one cast to z's dtype: as p_t → 1 it is a small difference of large terms that a bf16
intermediate would lose.

Inputs are bf16/fp16/fp32 logits; everything is computed in fp32. The kernels have the contracts of
`head._logit_stats` and `head._logit_grads_with_target` and are chosen over them on CUDA when Triton
is importable (fp64 heads keep the eager passes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements of a row each program reads per loop iteration, and the warps that read them: the best of a
# sweep over 1k–8k × 4–16 warps on an H200 (one 883 × 151,936 bf16 chunk).
_BLOCK = 4096
_WARPS = 8
# A chunk with fewer rows than this splits each row into segments so that every SM has work (the last,
# short chunk of a micro-batch); with more, one program reduces a whole row and writes the result.
_MIN_PROGRAMS = 512


@triton.jit
def _segment_stats(
    z_ptr,
    row_stride,
    vocab,
    seg_len,
    inv_t,
    out0_ptr,
    out1_ptr,
    out2_ptr,
    num_segments,
    BLOCK: tl.constexpr,
    WHOLE_ROW: tl.constexpr,
):
    """(m, s, t) of one segment of one row; with WHOLE_ROW (one segment per row) (lse, entropy) directly."""
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
    if WHOLE_ROW:
        lse = m + tl.log(s)
        tl.store(out0_ptr + row, lse)
        tl.store(out1_ptr + row, lse - t / s)
    else:
        out = row * num_segments + seg
        tl.store(out0_ptr + out, m)
        tl.store(out1_ptr + out, s)
        tl.store(out2_ptr + out, t)


@triton.jit
def _combine_segments(m_ptr, s_ptr, t_ptr, lse_ptr, ent_ptr, num_segments, K: tl.constexpr):
    """A row's (lse, entropy) from its segments' (m, s, t), each brought to the row's peak."""
    row = tl.program_id(0)
    k = tl.arange(0, K)
    mask = k < num_segments
    idx = row * num_segments + k
    m = tl.load(m_ptr + idx, mask=mask, other=float("-inf"))
    peak = tl.max(m, axis=0)
    scale = tl.where(mask, tl.exp(m - peak), 0.0)
    s = tl.sum(tl.load(s_ptr + idx, mask=mask, other=0.0) * scale, axis=0)
    t = tl.sum(tl.load(t_ptr + idx, mask=mask, other=0.0) * scale, axis=0)
    lse = peak + tl.log(s)
    tl.store(lse_ptr + row, lse)
    tl.store(ent_ptr + row, lse - t / s)


def _num_segments(rows: int, vocab: int) -> int:
    want = max(1, -(-_MIN_PROGRAMS // rows))
    return max(1, min(want, vocab // _BLOCK))


def logit_stats(z: torch.Tensor, inv_t: float, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, entropy) per row of `z` (n, V) scaled by `inv_t`, in `acc` (fp32 or wider)."""
    if z.stride(1) != 1:
        z = z.contiguous()
    n, vocab = z.shape
    k = _num_segments(n, vocab)
    seg_len = -(-vocab // k)
    out = torch.empty(2, n, dtype=torch.float32, device=z.device)
    if k == 1:
        _segment_stats[(n, 1)](
            z,
            z.stride(0),
            vocab,
            seg_len,
            float(inv_t),
            out[0],
            out[1],
            out[1],
            1,
            BLOCK=_BLOCK,
            WHOLE_ROW=True,
            num_warps=_WARPS,
        )
    else:
        parts = torch.empty(3, n, k, dtype=torch.float32, device=z.device)
        _segment_stats[(n, k)](
            z,
            z.stride(0),
            vocab,
            seg_len,
            float(inv_t),
            parts[0],
            parts[1],
            parts[2],
            k,
            BLOCK=_BLOCK,
            WHOLE_ROW=False,
            num_warps=_WARPS,
        )
        _combine_segments[(n,)](parts[0], parts[1], parts[2], out[0], out[1], k, K=triton.next_power_of_2(k))
    lse, entropy = out.to(acc) if acc != torch.float32 else out
    return lse, entropy


@triton.jit
def _grads_block(
    z_ptr,
    dz_ptr,
    z_row_stride,
    dz_row_stride,
    vocab,
    lse_ptr,
    a_ptr,
    b_ptr,
    c_ptr,
    tgt_ptr,
    inv_t,
    BLOCK: tl.constexpr,
):
    """dz = p·(a + b·log p) over one block of one row, plus c at the row's target column."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    row64 = row.to(tl.int64)  # a chunk holds 2^27+ elements: row × stride overflows int32 beyond 2^31
    lse = tl.load(lse_ptr + row).to(tl.float32)
    a = tl.load(a_ptr + row).to(tl.float32)
    b = tl.load(b_ptr + row).to(tl.float32)
    c = tl.load(c_ptr + row).to(tl.float32)
    tgt = tl.load(tgt_ptr + row)
    logp = tl.load(z_ptr + row64 * z_row_stride + cols, mask=mask, other=0.0).to(tl.float32) * inv_t - lse
    g = tl.exp(logp) * (a + b * logp)
    g = tl.where(cols == tgt, g + c, g)  # the target's entry, still in fp32
    tl.store(dz_ptr + row64 * dz_row_stride + cols, g.to(dz_ptr.dtype.element_ty), mask=mask)


def logit_grads(
    z: torch.Tensor,
    lse: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    targets: torch.Tensor,
    inv_t: float,
) -> torch.Tensor:
    """dz (n, V) in z's dtype: p·(a + b·log p) per logit of `z` (n, V), log p = z·inv_t − lse, plus c at
    column targets[i] of row i. lse, a, b, c (n,) (fp32 or wider), targets (n,) integer."""
    if z.stride(1) != 1:
        z = z.contiguous()
    n, vocab = z.shape
    dz = torch.empty((n, vocab), dtype=z.dtype, device=z.device)
    # Rows on the grid's first axis (up to 2^31 − 1), column blocks on the second (≤ 65,535: V < 2^28).
    # The reduction's block and warps serve here too: 3.8 TB/s of read + write on an H200 (883 × 151,936
    # bf16, do_bench), 94% of a device copy; 1k–8k × 4–8 warps all came within a few percent of it.
    _grads_block[(n, triton.cdiv(vocab, _BLOCK))](
        z,
        dz,
        z.stride(0),
        dz.stride(0),
        vocab,
        lse.contiguous(),
        a.contiguous(),
        b.contiguous(),
        c.contiguous(),
        targets.contiguous(),
        float(inv_t),
        BLOCK=_BLOCK,
        num_warps=_WARPS,
    )
    return dz
