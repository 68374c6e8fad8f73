"""The block-sparse attention kernel of the baselines (FlexPrefill, XAttention, PBS).

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
    Q, K, V, K_desc, V_desc, O, LSE, KV_IDX, KV_CNT, PERM,
    qk_scale, seq_len, num_q_blocks, heads_q, group,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    slb, slh, slm,
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
    STORE_LSE: tl.constexpr,
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
    if STORE_LSE:  # natural-log LSE of the computed logits (m_i is in log2 units); -inf: no key
        lse = tl.where(l_i > 0, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf"))
        lse_ptrs = LSE + b * slb + h * slh + offs_m.to(tl.int64) * slm
        tl.store(lse_ptrs, lse, mask=offs_m < seq_len)


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
    lse: torch.Tensor | None = None,
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
        lse: optional ``[B, Hq, L]`` fp32, filled with each row's natural-log log-sum-exp of the
            scaled logits it computed (``-inf`` for a row that saw no key), for merging another
            softmax term (FlashPrefill v2's mean correction); ``None``: not computed.
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
    if lse is not None and (lse.shape != (B, Hq, L) or lse.dtype != torch.float32):
        raise ValueError(
            f"lse must be a float32 tensor of shape {(B, Hq, L)}, got {lse.dtype} "
            f"{tuple(lse.shape)}"
        )
    lse_arg, lse_strides = (lse, lse.stride()) if lse is not None else (out, (0, 0, 0))
    sub, cfg = resolve_launch("block_sparse", launch, head_d=D, block_n=block_size, device=q.device)
    perm_strides = (perm.stride(0), perm.stride(1), perm.stride(2)) if permuted else (0, 0, 0)
    # PBS (permuted) gathers its listed blocks through the permutation; with descriptors for
    # its own-segment band alone it ran 2% slower at 64K-128K on an H200 (results/baselines)
    descs, use_desc = kernel_kv_args(k, v, sub, False if permuted else descriptors)
    _bsa_fwd_kernel[(nq, B * Hq)](
        q, k, v, *descs, out, lse_arg, kv_idx, kv_count, perm,
        scale * LOG2E, L, nq, Hq, Hq // Hkv,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse_strides,
        *kv_idx.stride(), *kv_count.stride(), *perm_strides,
        HEAD_DIM=D,
        BLOCK=block_size,
        SEG_BLOCKS=(segment_size // block_size) if permuted else 1,
        PERMUTED=permuted,
        USE_DESC=use_desc,
        SUB=sub,
        CAUSAL=bool(causal),
        MASK_ALL=not causal,
        STORE_LSE=lse is not None,
        **cfg,
    )  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# XAttention antidiagonal block scores
# --------------------------------------------------------------------------------------------
