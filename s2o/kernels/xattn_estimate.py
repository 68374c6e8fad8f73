"""XAttention's block-importance estimator on the GPU (the kernel of ``s2o.methods.xattn``).

:func:`xattn_block_scores`: the antidiagonal block scores in one fused pass (strided GEMM + online
softmax + per-block partial sums), then a finalize kernel that rescales the partial sums with
each row's final softmax statistics and sums the rows of each query block. Addresses are int64.
Never imports ``s2o.reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import check_head_dim

LOG2E = 1.4426950408889634


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@triton.jit
def _xattn_partial_kernel(
    Q, K, P, MU, ML,
    c_log2, seq_len, n_rows, heads_q, group,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    spb, sph, spr, spc,
    sub, suh, sur, sut,
    slb, slh, slr, sls,
    STRIDE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RB: tl.constexpr,
):  # fmt: skip
    """Reduced row ``i`` / column ``j``: ``R[i, j] = sum_u q[S*i + u] . k[S*j + S-1-u]``.

    Writes, per row and key tile, the partial per-block sums of ``exp2(x - m_tile)`` (P) and the
    running max they refer to (MU); at the end the row's final max and sum (ML).
    """
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    hk = h // group
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + b * sqb + h * sqh + offs_d[None, :] * sqd
    k_base = K + b * skb + hk * skh + offs_d[:, None] * skd
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, n_rows)
    for j0 in range(0, hi, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for u in range(STRIDE):
            qtok = rows.to(tl.int64) * STRIDE + u
            ktok = cols.to(tl.int64) * STRIDE + (STRIDE - 1 - u)
            qt = tl.load(q_base + qtok[:, None] * sqm, mask=qtok[:, None] < seq_len, other=0.0)
            kt = tl.load(k_base + ktok[None, :] * skn, mask=ktok[None, :] < seq_len, other=0.0)
            acc += tl.dot(qt, kt)
        x = tl.where(cols[None, :] <= rows[:, None], acc * c_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, 1))
        p = tl.math.exp2(x - m_new[:, None])
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(p, 1)
        m_i = m_new
        part = tl.sum(tl.reshape(p, [BLOCK_M, BLOCK_N // RB, RB]), 2)
        pcols = j0 // RB + tl.arange(0, BLOCK_N // RB)
        rmask = rows[:, None] < n_rows
        p_ptrs = P + b * spb + h * sph + rows.to(tl.int64)[:, None] * spr + pcols[None, :] * spc
        tl.store(p_ptrs, part, mask=rmask)
        mu_ptrs = MU + b * sub + h * suh + rows.to(tl.int64) * sur + (j0 // BLOCK_N) * sut
        tl.store(mu_ptrs, m_new, mask=rows < n_rows)
    ml = ML + b * slb + h * slh + rows.to(tl.int64) * slr
    tl.store(ml, m_i, mask=rows < n_rows)
    tl.store(ml + sls, l_i, mask=rows < n_rows)


@triton.jit
def _xattn_finalize_kernel(
    P, MU, ML, OUT,
    n_rows, n_valid_rows, heads_q,
    spb, sph, spr, spc,
    sub, suh, sur, sut,
    slb, slh, slr, sls,
    sob, soh, sor, soc,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RB: tl.constexpr,
):  # fmt: skip
    """``OUT[qb, kb] = sum_{rows i of qb} P[i, kb] * exp2(MU[i, tile(kb)] - m_i) / l_i``."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rvalid = rows < n_rows
    ml = ML + b * slb + h * slh + rows.to(tl.int64) * slr
    m_i = tl.load(ml, mask=rvalid, other=0.0)
    l_i = tl.load(ml + sls, mask=rvalid, other=1.0)
    inv_l = tl.where(rows < n_valid_rows, 1.0 / l_i, 0.0)  # padded query rows contribute 0
    qblocks = pid_m * (BLOCK_M // RB) + tl.arange(0, BLOCK_M // RB)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, n_rows)
    for j0 in range(0, hi, BLOCK_N):
        pcols = j0 // RB + tl.arange(0, BLOCK_N // RB)
        p_ptrs = P + b * spb + h * sph + rows.to(tl.int64)[:, None] * spr + pcols[None, :] * spc
        part = tl.load(p_ptrs, mask=rvalid[:, None], other=0.0)
        mu_ptrs = MU + b * sub + h * suh + rows.to(tl.int64) * sur + (j0 // BLOCK_N) * sut
        mu = tl.load(mu_ptrs, mask=rvalid, other=0.0)
        w = tl.math.exp2(mu - m_i) * inv_l
        blk = tl.sum(tl.reshape(part * w[:, None], [BLOCK_M // RB, RB, BLOCK_N // RB]), 1)
        o_ptrs = OUT + b * sob + h * soh + qblocks.to(tl.int64)[:, None] * sor
        o_ptrs += pcols[None, :] * soc
        tl.store(o_ptrs, blk, mask=(qblocks[:, None] * RB) < n_rows)


def xattn_block_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    block_size: int,
    stride: int,
    scale: float,
    norm: float = 1.0,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """XAttention block scores: per query block, the summed antidiagonal softmax mass per key block.

    With ``S = stride``, reduced query ``i`` and key ``j`` (``S`` tokens each, zero padding past
    ``L``) score ``R[i, j] = sum_u q[S*i+u] . k[S*j+S-1-u]`` (the antidiagonal of the ``S x S``
    sub-block), scaled by ``scale / (S * norm)``; each reduced row takes a causal softmax
    (``j <= i``); rows past ``ceil(L/S)`` are zero; ``out[qb, kb]`` sums the probabilities of the
    ``block_size/S`` rows of query block ``qb`` over the columns of key block ``kb``.

    Args:
        q: ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``.
        block_size, stride: powers of two, ``stride <= block_size``.
    Returns:
        ``[B, Hq, NB, NB]`` fp32, ``NB = ceil(L / block_size)``, zero above the diagonal.
    """
    B, Hq, L, D = q.shape
    if not (_is_pow2(block_size) and _is_pow2(stride) and stride <= block_size):
        raise ValueError(
            f"the Triton estimator needs powers of two with stride <= block_size, "
            f"got block_size={block_size}, stride={stride}"
        )
    check_head_dim(D)
    rb = block_size // stride
    nb = triton.cdiv(L, block_size)
    n_rows = nb * rb
    tile = (128 if D <= 128 else 64) if q.is_cuda else 16  # head_dim 256: 64-row tiles fit
    bm = block_m or max(tile, rb)
    bn = block_n or max(tile, rb)
    n_tiles = triton.cdiv(n_rows, bn)
    dev = q.device
    part = torch.empty(B, Hq, n_rows, triton.cdiv(n_rows, bn) * (bn // rb), device=dev)
    mu = torch.empty(B, Hq, n_rows, n_tiles, device=dev)
    ml = torch.empty(B, Hq, n_rows, 2, device=dev)
    grid = (triton.cdiv(n_rows, bm), B * Hq)
    warps = 8 if (bm >= 128 and bn >= 128) else 4
    _xattn_partial_kernel[grid](
        q, k, part, mu, ml,
        LOG2E * scale / (stride * norm), L, n_rows, Hq, Hq // k.shape[1],
        *q.stride(), *k.stride(), *part.stride(), *mu.stride(), *ml.stride(),
        STRIDE=stride, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, RB=rb,
        num_warps=warps, num_stages=3 if q.is_cuda else 1,
    )  # fmt: skip
    # finalize writes whole output column tiles; pad the output so they stay in bounds
    out_pad = torch.zeros(B, Hq, nb, triton.cdiv(n_rows, bn) * (bn // rb), device=dev)
    _xattn_finalize_kernel[grid](
        part, mu, ml, out_pad,
        n_rows, triton.cdiv(L, stride), Hq,
        *part.stride(), *mu.stride(), *ml.stride(), *out_pad.stride(),
        BLOCK_M=bm, BLOCK_N=bn, RB=rb,
        num_warps=4,
    )  # fmt: skip
    return out_pad[..., :nb]
