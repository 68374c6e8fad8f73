"""Shared Triton kernels of the block-sparse baselines (FlexPrefill, XAttention, PBS).

* :func:`block_sparse_attention`: causal block-sparse FlashAttention forward. Query block ``r``
  (``block_size`` rows) visits the key blocks listed in ``kv_idx[b, h, r, :kv_count[b, h, r]]``
  (ascending), then a contiguous causal *band* that ends at the diagonal block:

  - plain variant (``key_perm=None``, FlexPrefill / XAttention): the band is the diagonal block when
    the list ends with ``r`` (it is then taken out of the list loop), else empty;
  - permuted variant (``key_perm`` given, PBS): list entries are blocks of the *permuted* key order,
    key ``j`` of permuted block ``c`` is token ``key_perm[b, h, c*block_size + j]`` (gathered by
    index, no permuted copy of K/V), and the band is the query's own segment
    ``[segment_start, r]`` in original order. Attention is a sum over keys, so the order inside the
    own segment does not change the result; original order makes the causal mask the usual one.

  Only the diagonal tile is masked. GQA is native: query head ``h`` reads key/value head
  ``h // (Hq // Hkv)``. Addresses are int64. fp32 accumulation, exp2 online softmax.
* :func:`xattn_block_scores`: XAttention's antidiagonal block scores in one fused pass (strided
  GEMM + online softmax + per-block partial sums), then a finalize kernel that rescales the
  partial sums with each row's final softmax statistics and sums the rows of each query block.
* :func:`mask_to_lists`: ``[B, H, NQ, NK]`` bool mask -> ascending per-row index lists, on device.

Never imports ``s2o.reference``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import Launch, check_head_dim, resolve_launch
from .tma import kernel_kv_args

LOG2E = 1.4426950408889634


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def mask_to_lists(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ascending lists of the ``True`` columns of a block mask, without host syncs.

    Args:
        mask: ``[B, H, NQ, NK]`` bool.
    Returns:
        ``(kv_idx [B, H, NQ, NK] int32, kv_count [B, H, NQ] int32)``; entries of ``kv_idx`` past
        ``kv_count`` are unspecified.
    """
    nk = mask.shape[-1]
    count = mask.sum(-1, dtype=torch.int32)
    pos = torch.cumsum(mask, dim=-1, dtype=torch.int32) - 1
    pos = torch.where(mask, pos, nk).long()  # unselected columns go to a dump slot
    cols = torch.arange(nk, device=mask.device, dtype=torch.int32).expand(mask.shape)
    idx = torch.empty((*mask.shape[:-1], nk + 1), device=mask.device, dtype=torch.int32)
    idx.scatter_(-1, pos, cols)
    return idx[..., :nk], count


# --------------------------------------------------------------------------------------------
# Block-sparse attention
# --------------------------------------------------------------------------------------------


@triton.jit
def _bsa_kv(k_base, v_base, skn, svn, K_desc, V_desc, b, hk, kpos, kok, start,
            BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
            USE_DESC: tl.constexpr):  # fmt: skip
    """``k`` ``[HEAD_DIM, BLOCK]`` and ``v`` ``[BLOCK, HEAD_DIM]`` of key rows ``kpos``: through
    TMA descriptors (contiguous rows ``start ..``; rows past the end come back as zeros) or
    through pointers (any rows; ``MASKED`` loads only rows with ``kok``)."""
    if USE_DESC:
        k = tl.trans(K_desc.load([b, hk, start, 0]).reshape(BLOCK, HEAD_DIM))
        v = V_desc.load([b, hk, start, 0]).reshape(BLOCK, HEAD_DIM)
    else:
        k_ptrs = k_base + kpos[None, :] * skn
        v_ptrs = v_base + kpos[:, None] * svn
        if MASKED:
            k = tl.load(k_ptrs, mask=kok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=kok[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    return k, v


@triton.jit
def _bsa_tile(q, k, v, m_i, l_i, acc, qk_scale, mask, MASKED: tl.constexpr):
    """One key tile of the online softmax; ``mask`` ``[BLOCK_M, SUB]`` is used when MASKED."""
    qk = tl.dot(q, k) * qk_scale
    if MASKED:
        qk = tl.where(mask, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # P V accumulates in the MMA
    return m_new, l_i, acc


@triton.jit
def _bsa_part(
    q, m_i, l_i, acc, k_base, v_base, skn, svn, K_desc, V_desc, b32, hk32, perm_row, spn, start,
    offs_m, seq_len, qk_scale, SUB: tl.constexpr, HEAD_DIM: tl.constexpr, GATHER: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_DESC: tl.constexpr,
):  # fmt: skip
    """``SUB`` keys of a block from slot ``start``: original rows ``start ..`` or, with GATHER,
    rows ``perm[start ..]``. MASKED (causal: the diagonal block; non-causal: every block) masks
    keys after the row (CAUSAL) or at or past ``seq_len``."""
    start = tl.full([], 0, tl.int64) + start  # an int (interpreter loops) or a tensor
    slot = start + tl.arange(0, SUB)
    kok = slot < seq_len
    if GATHER:  # rows gathered through the permutation (pointer loads, USE_DESC off)
        kpos = tl.load(perm_row + slot * spn, mask=kok, other=0).to(tl.int64)
    else:
        kpos = slot.to(tl.int64)
    k, v = _bsa_kv(k_base, v_base, skn, svn, K_desc, V_desc, b32, hk32, kpos, kok,
                   start.to(tl.int32), SUB, HEAD_DIM, MASKED, USE_DESC)  # fmt: skip
    if CAUSAL:
        mask = offs_m[:, None] >= kpos[None, :]
    else:
        mask = kok[None, :] & (offs_m >= 0)[:, None]
    return _bsa_tile(q, k, v, m_i, l_i, acc, qk_scale, mask, MASKED)


@triton.jit
def _bsa_fwd_kernel(
    Q, K, V, K_desc, V_desc, O, KV_IDX, KV_CNT, PERM,
    qk_scale, seq_len, num_q_blocks, heads_q, group,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    sib, sih, sim, sik,
    scb, sch, scm,
    spb, sph, spn,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    SEG_BLOCKS: tl.constexpr,
    PERMUTED: tl.constexpr,
    USE_DESC: tl.constexpr,
    SUB: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_ALL: tl.constexpr,
):  # fmt: skip
    qb = num_q_blocks - 1 - tl.program_id(0)  # longest rows first
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    hk = h // group
    offs_m = qb * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * sqb + h * sqh + offs_m.to(tl.int64)[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < seq_len, other=0.0)
    k_base = K + b * skb + hk * skh + offs_d[:, None] * skd
    v_base = V + b * svb + hk * svh + offs_d[None, :] * svd
    perm_row = PERM + b * spb + h * sph

    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)

    idx_base = KV_IDX + b * sib + h * sih + qb.to(tl.int64) * sim
    count = tl.load(KV_CNT + b * scb + h * sch + qb.to(tl.int64) * scm)
    if PERMUTED:
        band_lo = (qb // SEG_BLOCKS) * SEG_BLOCKS
        n_list = count
    elif CAUSAL:
        last = tl.load(idx_base + tl.maximum(count - 1, 0) * sik)
        has_diag = (count > 0) & (last == qb)
        band_lo = tl.where(has_diag, qb, qb + 1)
        n_list = count - has_diag.to(tl.int32)
    else:  # every listed block, masked to the sequence; no band
        band_lo = qb + 1
        n_list = count
    if CAUSAL:
        n_band = qb - band_lo  # the diagonal block comes after the band
    elif PERMUTED:  # the whole own segment
        n_band = tl.minimum(band_lo + SEG_BLOCKS, num_q_blocks) - band_lo
    else:
        n_band = 0

    b32, hk32 = b.to(tl.int32), hk.to(tl.int32)
    # flat loops over SUB-key parts (one K and one V part per pipeline stage; a loop over whole
    # blocks stages every part of a block: 320 KiB at head_dim 256 with 128-key blocks)
    SPLIT: tl.constexpr = BLOCK // SUB
    for i in range(0, n_list * SPLIT):
        c = tl.load(idx_base + (i // SPLIT) * sik).to(tl.int64)
        m_i, l_i, acc = _bsa_part(
            q, m_i, l_i, acc, k_base, v_base, skn, svn, K_desc, V_desc, b32, hk32, perm_row, spn,
            c * BLOCK + (i % SPLIT) * SUB, offs_m, seq_len, qk_scale, SUB, HEAD_DIM, PERMUTED,
            MASK_ALL, CAUSAL, USE_DESC,
        )  # fmt: skip
    for u in range(band_lo * SPLIT, (band_lo + n_band) * SPLIT):
        m_i, l_i, acc = _bsa_part(
            q, m_i, l_i, acc, k_base, v_base, skn, svn, K_desc, V_desc, b32, hk32, perm_row, spn,
            u * SUB, offs_m, seq_len, qk_scale, SUB, HEAD_DIM, False, MASK_ALL,
            CAUSAL, USE_DESC,
        )  # fmt: skip
    if CAUSAL:
        if band_lo <= qb:
            for t in tl.static_range(SPLIT):
                m_i, l_i, acc = _bsa_part(
                    q, m_i, l_i, acc, k_base, v_base, skn, svn, K_desc, V_desc, b32, hk32,
                    perm_row, spn, qb.to(tl.int64) * BLOCK + t * SUB, offs_m, seq_len, qk_scale,
                    SUB, HEAD_DIM, False, True, CAUSAL, USE_DESC,
                )  # fmt: skip

    # a row that saw no key (empty list, diagonal not selected) outputs 0
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_ptrs = O + b * sob + h * soh + offs_m.to(tl.int64)[:, None] * som + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_m[:, None] < seq_len)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_idx: torch.Tensor,
    kv_count: torch.Tensor,
    *,
    block_size: int,
    scale: float | None = None,
    key_perm: torch.Tensor | None = None,
    segment_size: int | None = None,
    out: torch.Tensor | None = None,
    causal: bool = True,
    launch: Launch | None = None,
    descriptors: bool | None = None,
) -> torch.Tensor:
    """Block-sparse attention with square ``block_size`` tiles, causal or not.

    Args:
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]``; fp16/bf16 (fp32 under the interpreter);
            ``D`` in :data:`~s2o.kernels.launch.HEAD_DIMS`.
        kv_idx: ``[B, Hq, NQ, W]`` int32, ascending key-block ids per query block,
            ``NQ = ceil(L / block_size)``. Plain causal: ids ``<= r`` (the diagonal ``r``, if
            present, last); plain non-causal: any ids. Permuted variant: ids of permuted blocks
            outside the own segment (causal: before it).
        kv_count: ``[B, Hq, NQ]`` int32, number of valid entries of each list.
        block_size: power of two >= 16 (the tile counted; ``launch.sub_n`` may split its keys).
        scale: softmax scale, default ``1/sqrt(D)``.
        key_perm: ``[B, Hq, L]`` int, permuted position -> original token (PBS); ``None`` for the
            plain variant.
        segment_size: PBS segment length (multiple of ``block_size``), with ``key_perm`` only;
            the own segment is computed densely (causal: up to the diagonal).
        out: optional preallocated output (tests NaN-fill it).
        causal: False: no causal mask; the listed blocks (and PBS's whole own segment) only.
        launch: :class:`~s2o.kernels.launch.Launch` (None fields: defaults for the head size).
        descriptors: TMA loads of the contiguous tiles (None: automatic; never for PBS's list).
    Returns:
        ``[B, Hq, L, D]`` in q's dtype.
    """
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    if not _is_pow2(block_size) or block_size < 16:
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    check_head_dim(D)
    nq = triton.cdiv(L, block_size)
    if kv_idx.shape[:3] != (B, Hq, nq) or kv_count.shape != (B, Hq, nq):
        raise ValueError(
            f"kv_idx {tuple(kv_idx.shape)} / kv_count {tuple(kv_count.shape)} do not match "
            f"(B, Hq, NQ) = {(B, Hq, nq)}"
        )
    permuted = key_perm is not None
    if permuted:
        if segment_size is None or segment_size % block_size:
            raise ValueError(
                f"segment_size={segment_size} must be a multiple of block_size={block_size}"
            )
        perm = key_perm
    else:
        perm = kv_count  # unused placeholder pointer
    if out is None:
        out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    sub, cfg = resolve_launch("block_sparse", launch, head_d=D, block_n=block_size, device=q.device)
    perm_strides = (perm.stride(0), perm.stride(1), perm.stride(2)) if permuted else (0, 0, 0)
    # PBS (permuted) gathers its listed blocks through the permutation; with descriptors for
    # its own-segment band alone it ran 2% slower at 64K-128K on an H200 (results/baselines)
    descs, use_desc = kernel_kv_args(k, v, sub, False if permuted else descriptors)
    _bsa_fwd_kernel[(nq, B * Hq)](
        q, k, v, *descs, out, kv_idx, kv_count, perm,
        scale * LOG2E, L, nq, Hq, Hq // Hkv,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *kv_idx.stride(), *kv_count.stride(), *perm_strides,
        HEAD_DIM=D,
        BLOCK=block_size,
        SEG_BLOCKS=(segment_size // block_size) if permuted else 1,
        PERMUTED=permuted,
        USE_DESC=use_desc,
        SUB=sub,
        CAUSAL=bool(causal),
        MASK_ALL=not causal,
        **cfg,
    )  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# XAttention antidiagonal block scores
# --------------------------------------------------------------------------------------------


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
