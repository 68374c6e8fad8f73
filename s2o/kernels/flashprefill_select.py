"""FlashPrefill's block selection on the GPU (the kernels of ``s2o.methods.flashprefill``).

:func:`flashprefill_select`: a pooling kernel (the mean key of each block per KV head, stored in
the input dtype) and one scoring kernel per (query tile, batch x query head) that scores the tile
against every pooled key block ending at or before its rows, keeps per chunk of key blocks the sum
of ``exp2`` against the running tile maximum, rescales the chunks to the final maximum, normalizes,
and writes the thresholded mask with the forced blocks (sink, local, dense tail). Addresses are
int64. Never imports ``s2o.reference`` or ``s2o.methods``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import check_head_dim

LOG2E = 1.4426950408889634
# the official normalize_scores' denominator guard; a constexpr, as every global a kernel reads
NORM_EPS = tl.constexpr(1e-9)


@triton.jit
def _flashprefill_pool_kernel(
    K, KM, seq_len, heads_kv,
    skb, skh, skn, skd,
    smb, smh, smn, smd,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """``KM[b, h, j] = mean(K[b, h, j*BLOCK : min((j+1)*BLOCK, L)])`` in K's dtype."""
    j = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads_kv).to(tl.int64)
    h = (bh % heads_kv).to(tl.int64)
    toks = j.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = K + b * skb + h * skh + toks[:, None] * skn + offs_d[None, :] * skd
    x = tl.load(ptrs, mask=toks[:, None] < seq_len, other=0.0).to(tl.float32)
    n = tl.minimum(seq_len - j.to(tl.int64) * BLOCK, BLOCK).to(tl.float32)
    mean = tl.sum(x, 0) / n
    out = KM + b * smb + h * smh + j.to(tl.int64) * smn + offs_d * smd
    tl.store(out, mean.to(KM.dtype.element_ty))


@triton.jit
def _flashprefill_score_kernel(
    Q, KM, S, CM, MASK,
    c_log2, alpha, seq_len, nb, heads_q, group, sink, local, tail,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    ssb, ssh, ssr, ssc,
    scb, sch, scr, scc,
    smb, smh, smr, smc,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Query tile ``t``: normalized block scores ``S[b, h, t, :]`` and the mask row
    ``MASK[b, h, t, :]``; ``CM`` holds the running tile maximum after each chunk of key blocks."""
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    hk = h // group
    rows = t.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=rows[:, None] < seq_len, other=0.0)  # zero rows past L count
    s_row = S + b * ssb + h * ssh + t.to(tl.int64) * ssr
    cm_row = CM + b * scb + h * sch + t.to(tl.int64) * scr
    n_scored = t // BLOCK_N + 1  # chunks holding blocks 0..t
    run_max = tl.full((), -1e30, tl.float32)
    for c in range(0, n_scored):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        km_ptrs = KM + b * skb + hk * skh + cols.to(tl.int64)[:, None] * skn + offs_d[None, :] * skd
        km = tl.load(km_ptrs, mask=cols[:, None] < nb, other=0.0)
        x = tl.dot(q, tl.trans(km)) * c_log2
        ends = (cols.to(tl.int64) + 1) * BLOCK - 1
        x = tl.where(rows[:, None] >= ends[None, :], x, float("-inf"))
        run_max = tl.maximum(run_max, tl.max(x))
        tl.store(s_row + cols * ssc, tl.sum(tl.math.exp2(x - run_max), 0), mask=cols < nb)
        tl.store(cm_row + c * scc, run_max)
    total = tl.zeros((), tl.float32)
    best = tl.zeros((), tl.float32)
    for c in range(0, n_scored):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        e = tl.load(s_row + cols * ssc, mask=cols <= t, other=0.0)
        e *= tl.math.exp2(tl.load(cm_row + c * scc) - run_max)
        tl.store(s_row + cols * ssc, e, mask=cols <= t)
        total += tl.sum(e)
        best = tl.maximum(best, tl.max(e))
    inv = 1.0 / (total + NORM_EPS)
    threshold = alpha * (best * inv)
    m_row = MASK + b * smb + h * smh + t.to(tl.int64) * smr
    for c in range(0, tl.cdiv(nb, BLOCK_N)):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        sc = tl.load(s_row + cols * ssc, mask=cols <= t, other=0.0) * inv
        tl.store(s_row + cols * ssc, sc, mask=cols < nb)
        forced = (cols < sink) | (t - cols < local) | (t >= nb - tail)
        keep = ((sc >= threshold) | forced) & (cols <= t)
        tl.store(m_row + cols * smc, keep.to(tl.int8), mask=cols < nb)


def flashprefill_select(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    block_size: int,
    scale: float,
    alpha: float,
    sink_blocks: int,
    local_blocks: int,
    dense_tail_tiles: int,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashPrefill's block mask (``s2o.methods.flashprefill``, steps 1-4 without ``min_budget``).

    Args:
        q: ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``; fp16/bf16 (fp32 under the interpreter).
        block_size: query tile and key block edge, a power of two >= 16.
        scale: softmax scale of the logits.
        alpha: keep a block when its score >= ``alpha`` x the row's best score.
        sink_blocks, local_blocks, dense_tail_tiles: the forced blocks.
        block_n: pooled key blocks per scoring step (power of two >= 16; default 64 on a GPU).
    Returns:
        ``(mask [B, Hq, NB, NB] bool, causal; scores [B, Hq, NB, NB] fp32 normalized, 0 where a
        block is not scored)``, ``NB = ceil(L / block_size)``.
    """
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    bn = block_n or (64 if q.is_cuda else 16)
    for name, val in (("block_size", block_size), ("block_n", bn)):
        if val < 16 or val & (val - 1):
            raise ValueError(
                f"{name} must be a power of two >= 16 for the Triton kernel, got {val}"
            )
    check_head_dim(D)
    nb = triton.cdiv(L, block_size)
    dev = q.device
    km = torch.empty(B, Hkv, nb, D, device=dev, dtype=k.dtype)
    _flashprefill_pool_kernel[(nb, B * Hkv)](
        k, km, L, Hkv, *k.stride(), *km.stride(), HEAD_DIM=D, BLOCK=block_size,
    )  # fmt: skip
    scores = torch.empty(B, Hq, nb, nb, device=dev)
    chunk_max = torch.empty(B, Hq, nb, triton.cdiv(nb, bn), device=dev)
    mask = torch.empty(B, Hq, nb, nb, device=dev, dtype=torch.int8)
    _flashprefill_score_kernel[(nb, B * Hq)](
        q, km, scores, chunk_max, mask,
        scale * LOG2E, float(alpha), L, nb, Hq, Hq // Hkv,
        sink_blocks, local_blocks, dense_tail_tiles,
        *q.stride(), *km.stride(), *scores.stride(), *chunk_max.stride(), *mask.stride(),
        HEAD_DIM=D, BLOCK=block_size, BLOCK_N=bn,
        num_warps=8 if block_size >= 128 else 4, num_stages=2 if q.is_cuda else 1,
    )  # fmt: skip
    return mask.bool(), scores
