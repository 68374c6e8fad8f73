"""S2O attention kernels: Pass-1, Pass-2 (early stop), and the fused single pass.

One program owns one ``BLOCK_M`` query tile of one (batch, query head); the key/value head is
``h // GROUP`` (GQA without repeating K/V). Scores live in the log2 domain: ``s2 = q.k * scale *
log2(e)``, ``p = exp2(s2 - m2)``, so ``m`` in the buffers is ``m2``. Every tile update is the
FlashAttention online-softmax recurrence; the Pass-2 walk adds the tile-level stop rule:

    m2' = max(m2, rowmax s2); p = exp2(s2 - m2'); gain = rowsum p; l_old = l * exp2(m2 - m2')
    if no valid row has gain >= tau * l_old: stop after this tile, count it as visited

and the tile that triggers the stop is added (``stop_tile="keep"``, the paper's kernel, checked one
tile late) or dropped (``"discard"``, Alg. 3 as printed); ``KEEP_STOP`` selects it. This
 is the reference's rule with ``exp`` written as ``exp2`` of log2e-prescaled scores (the two
sides of the comparison are the same real numbers, only rounded differently).

Pass-1 hands Pass-2 each row's fp32 ``m2`` and ``l`` and its normalized partial output
``o = acc / l`` in the input dtype; Pass-2 restarts from ``acc = o * l``. The stop rule reads only
``m2`` and ``l``, so the decisions are those of an fp32 ``acc``; the output carries one more
rounding of the Pass-1 part, and the state is half the bytes (1 GiB instead of 2 at 128K, 32
heads). The contiguous K/V tiles (Pass-1, the fused kernel's dense part) load through TMA tensor
descriptors on Hopper-class GPUs (the launchers' ``descriptors`` argument); the ranked walk
gathers rows through ``kv_perm`` with pointer loads.

Head sizes up to 256: a ``block_n`` key tile may be computed in ``SUB_N``-key parts
(:class:`~s2o.kernels.launch.Launch` ``sub_n``; 64 by default at head_dim 256, where 128 x 256
K and V tiles do not fit the shared memory). Stop decisions and statistics stay per
``block_m x block_n`` tile. ``CAUSAL=False``: Pass-1 covers the whole own segment and the walk
ranks every key outside the window and the segment.

The walking kernels take the K/V row strides as constexprs (one compile per layout: the gathered
rows' addresses are then shifts, not multiplies) and ``EVEN`` (:func:`_even`: every ranked tile
full), which drops the per-element column mask: a dead tile becomes the identity by per-row
selects (``m`` kept, ``p = exp2(s - inf) = 0``): the same decisions in fewer instructions a tile
(the compiler may then contract ``s * scale - m`` into one FMA, so an output can differ from the
masked walk's by rounding: one bf16 ulp in ``results/kernels/run10_h100/ab_54012af.json``).

Constexpr switches used by the overhead decomposition (benchmarks/abcd.py):
``USE_QPERM`` (gather query rows through ``q_perm``), ``GATHER`` (gather key rows through
``kv_perm``; off = contiguous key tiles ``0..P-1``) and ``EARLY_STOP`` (stop-rule control flow).
``TOPK`` is S2O's top-k mode (``topk_ratio``; benchmarks/fig5_bsa.py): the walk of segment ``n``
is cut to the first ``WALK_KEYS[n]`` ranked keys, a per-segment table the launcher computes with
:func:`s2o.stats.s2o_walk_tiles` (the decimal rounding of the ratio stays on the host); with
``tau <= 0`` it is the plain indexed-sorted walk (kernel C) over those tiles.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ..dense_tail import tail_start
from ..stats import refuse_topk_with_early_stop, s2o_walk_tiles
from ..tail_rank import tail_rows
from .launch import Launch, check_head_dim, resolve_launch
from .tma import kernel_kv_args

LOG2E = 1.4426950408889634

# (first chunk, growth per chunk) of the early-stop walk: a pipeline refill per chunk vs wasted
# products after the stop; (2, 1) was the best overall of the sweep in results/kernels/README.md
STOP_CHUNK = (2, 1)


def _stop_chunk(stop_chunk: tuple[int, int] | None) -> tuple[int, int]:
    n, grow = STOP_CHUNK if stop_chunk is None else (int(stop_chunk[0]), int(stop_chunk[1]))
    if n < 1 or grow < 0:
        raise ValueError(f"stop_chunk must be (first >= 1, growth >= 0), got {stop_chunk!r}")
    return n, grow


@triton.jit
def _tile_update(q, k, v, m_i, l_i, acc, qk_scale, mask, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One online-softmax step over a key tile; ``mask`` [BM, BN] is used only when MASKED."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    else:
        s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    m_i, l_i, acc, _, _ = _softmax_step(s, v, m_i, l_i, acc, IEEE)
    return m_i, l_i, acc


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc, IEEE: tl.constexpr):
    """The online-softmax update for log2-domain scores ``s`` [BM, BN] of one key tile:
    ``(m', l', acc', alpha, rowsum p)``. P V accumulates into the rescaled state inside the MMA
    (no separate product and add)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    psum = tl.sum(p, 1)
    return m_new, l_i * alpha + psum, acc, alpha, psum


@triton.jit
def _contig_kv(K_head, V_head, K_desc, V_desc, b, hk, start, L, stride_kl, stride_vl,
               BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, USE_DESC: tl.constexpr,
               MASKED: tl.constexpr):  # fmt: skip
    """Key/value rows ``start .. start+BLOCK_N-1`` (zeros past ``L`` when MASKED): through the
    tensor descriptors (TMA; rows past ``L`` come back as zeros) or through pointers."""
    if USE_DESC:
        k = K_desc.load([b, hk, start, 0]).reshape(BLOCK_N, HEAD_D)
        v = V_desc.load([b, hk, start, 0]).reshape(BLOCK_N, HEAD_D)
    else:
        cols = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
        offs_d = tl.arange(0, HEAD_D)
        if MASKED:
            ok = (cols < L)[:, None]
            k = tl.load(K_head + cols[:, None] * stride_kl + offs_d[None, :], mask=ok, other=0.0)
            v = tl.load(V_head + cols[:, None] * stride_vl + offs_d[None, :], mask=ok, other=0.0)
        else:
            k = tl.load(K_head + cols[:, None] * stride_kl + offs_d[None, :])
            v = tl.load(V_head + cols[:, None] * stride_vl + offs_d[None, :])
    return k, v


@triton.jit
def _dense_part(
    q, m_i, l_i, acc, K_head, V_head, K_desc, V_desc, b, hk, stride_kl, stride_vl, rows, lo, hi,
    a, L, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    IEEE: tl.constexpr, USE_DESC: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """Pass-1 body for query rows ``a .. a+BLOCK_M-1`` in original order: keys ``[lo, row]``
    (CAUSAL) or ``[lo, hi)`` (the window and the whole own segment). BLOCK_N is a key sub-tile."""
    offs_n = tl.arange(0, BLOCK_N)
    if CAUSAL:
        n_full = (a + 1 - lo) // BLOCK_N  # key tiles entirely at or below every row of the tile
        end = tl.minimum(a + BLOCK_M, L)
    else:
        n_full = (hi - lo) // BLOCK_N
        end = hi
    for j in range(0, n_full):
        k, v = _contig_kv(K_head, V_head, K_desc, V_desc, b, hk, lo + j * BLOCK_N, L, stride_kl,
                          stride_vl, BLOCK_N, HEAD_D, USE_DESC, False)  # fmt: skip
        m_i, l_i, acc = _tile_update(q, k, v, m_i, l_i, acc, qk_scale, None, False, IEEE)
    for start in range(lo + n_full * BLOCK_N, end, BLOCK_N):
        k, v = _contig_kv(K_head, V_head, K_desc, V_desc, b, hk, start, L, stride_kl, stride_vl,
                          BLOCK_N, HEAD_D, USE_DESC, True)  # fmt: skip
        cols = start + offs_n
        if CAUSAL:
            mask = (cols[None, :] <= rows[:, None]) & (cols < L)[None, :]
        else:
            mask = (cols < hi)[None, :] & (rows >= 0)[:, None]
        m_i, l_i, acc = _tile_update(q, k, v, m_i, l_i, acc, qk_scale, mask, True, IEEE)
    return m_i, l_i, acc


@triton.jit
def _load_kv_tile(K_head, V_head, KVP_row, stride_kl, stride_vl, start, P,
                  BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, GATHER: tl.constexpr):  # fmt: skip
    """Key rows ``start .. start+BLOCK_N-1`` of the ranked walk: ``kv_perm[start ..]`` (or the
    positions themselves without GATHER); zeros past ``P``."""
    cols = start + tl.arange(0, BLOCK_N)
    col_ok = cols < P
    if GATHER:
        idx = tl.load(KVP_row + cols, mask=col_ok, other=0).to(tl.int64)
    else:
        idx = cols.to(tl.int64)
    offs_d = tl.arange(0, HEAD_D)
    ok = col_ok[:, None]
    k = tl.load(K_head + idx[:, None] * stride_kl + offs_d[None, :], mask=ok, other=0.0)
    v = tl.load(V_head + idx[:, None] * stride_vl + offs_d[None, :], mask=ok, other=0.0)
    return k, v, col_ok


@triton.jit
def _scores(q, k, qk_scale, cols, lim, IEEE: tl.constexpr, MASKED: tl.constexpr = True):
    """``q k^T`` in the log2 domain, ``-inf`` at columns ``>= lim`` (when MASKED)."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if MASKED:
        return tl.where((cols < lim)[None, :], s * qk_scale, float("-inf"))
    return s * qk_scale


@triton.jit
def _walk_step(q, k, v, m_i, l_i, acc, qk_scale, cols, lim, IEEE: tl.constexpr):
    """One online-softmax step of the ranked walk over a key (sub-)tile, columns ``>= lim``
    masked: ``(m', l', acc', alpha, rowsum p)``; the caller keeps its stop-rule state."""
    s = _scores(q, k, qk_scale, cols, lim, IEEE)
    return _softmax_step(s, v, m_i, l_i, acc, IEEE)


@triton.jit
def _sub_tiled_update(
    q, m_i, l_i, acc, K_head, V_head, KVP_row, stride_kl, stride_vl, j, P, lim, qk_scale,
    BLOCK_N: tl.constexpr, SUB_N: tl.constexpr, HEAD_D: tl.constexpr, GATHER: tl.constexpr,
    IEEE: tl.constexpr, ADD: tl.constexpr,
):  # fmt: skip
    """Key tile ``j`` (``BLOCK_N`` ranked keys, columns ``< lim`` live) in ``SUB_N``-row parts.

    Returns the state (unchanged without ADD), and per row the tile's gain ``g`` and the mass
    before the tile ``l0``, both in the scale of the final running max: ``g = sum exp2(s - m')``
    over the tile, ``l0 = l * exp2(m - m')``; the same numbers as one ``BLOCK_N`` product, summed
    in ``BLOCK_N / SUB_N`` online steps.
    """
    g = tl.zeros_like(l_i)
    l0 = l_i
    m_run = m_i
    for t in tl.static_range(BLOCK_N // SUB_N):
        start = j * BLOCK_N + t * SUB_N
        k, v, col_ok = _load_kv_tile(K_head, V_head, KVP_row, stride_kl, stride_vl, start, P, SUB_N,
                                HEAD_D, GATHER)  # fmt: skip
        s = _scores(q, k, qk_scale, start + tl.arange(0, SUB_N), lim, IEEE)
        m_new = tl.maximum(m_run, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_run - m_new)
        g = g * alpha + tl.sum(p, 1)
        l0 = l0 * alpha
        m_run = m_new
        if ADD:
            if IEEE:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    if ADD:
        m_i = m_run
        l_i = l0 + g
    return m_i, l_i, acc, g, l0


@triton.jit
def _keep_walk_sub_tiled_lean(
    q, m_i, l_i, acc, K_head, V_head, KVP_row, stride_kl, stride_vl, P, row_ok, qk_scale, tau,
    go, visited, j0, n_chunk, BLOCK_N: tl.constexpr, SUB_N: tl.constexpr,
    HEAD_D: tl.constexpr, GATHER: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """One chunk of ``n_chunk`` tiles of the ``"keep"`` walk (tile ``j0`` first) as one flat,
    pipelined loop over ``SUB_N``-key sub-tiles: one K and one V sub-tile in flight per stage
    (a loop over whole tiles would stage every sub-tile of a tile: 256 KiB at head_dim 256).

    No gain accumulator: a tile's gain in the final scale is ``l - l0`` (``l0``: the mass before
    the tile, restarted at its first sub-tile and rescaled by the tile's alphas), so the rule is
    ``l - l0 >= tau * l0`` (at ``tau <= 0`` it always holds: ``l`` and ``l0`` start equal and are
    scaled by the same alphas, and rounding is monotone). No row flags carried: the tile's flags
    are reduced across rows once, in an ``if`` on its last sub-tile (no cross-warp reduction and
    barrier on the other sub-tiles; the ``if`` holds no dot), straight into ``go`` after the tile
    is counted, so the next tile sees the decision as in the deferred check.

    This walk won the GPU A/B against a walk carrying a gain accumulator and row flags and
    reducing them at every sub-tile, and against this walk reducing at every sub-tile without the
    ``if`` (H100, L=32K, D=256, 32/8 heads: ``results/kernels/run9_head_dims/README.md``, records
    ``results/benchmarks/bench_s2o/de2ec653f566``, ``79399c883271``, ``b0de1c37bf51``); the
    losers were removed afterwards (git keeps them: ``git log -S subtile_check``).
    Returns ``(m, l, acc, go, visited)``; the chunk's last decision is already in ``go``."""
    SPLIT: tl.constexpr = BLOCK_N // SUB_N
    l0 = l_i
    for c in range(0, n_chunk * SPLIT):
        u = j0 * SPLIT + c  # sub-tile of the walk
        k, v, col_ok = _load_kv_tile(K_head, V_head, KVP_row, stride_kl, stride_vl, u * SUB_N, P,
                                     SUB_N, HEAD_D, GATHER)  # fmt: skip
        last = (c % SPLIT) == SPLIT - 1
        l0 = tl.where((c % SPLIT) == 0, l_i, l0)
        lim = P * go.to(tl.int32)  # 0 for a dead tile: every column masked
        cols = u * SUB_N + tl.arange(0, SUB_N)
        m_i, l_i, acc, alpha, _ = _walk_step(q, k, v, m_i, l_i, acc, qk_scale, cols, lim, IEEE)
        l0 = l0 * alpha
        visited += (go & last).to(tl.int32)
        if last:
            go = go & (tl.max((((l_i - l0) >= tau * l0) & row_ok).to(tl.int32), 0) > 0)
    return m_i, l_i, acc, go, visited


@triton.jit
def _ranked_walk(
    q, m_i, l_i, acc, K_head, V_head, KVP_row, stride_kl, stride_vl, P, row_ok, qk_scale, tau,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, GATHER: tl.constexpr,
    EARLY_STOP: tl.constexpr, KEEP_STOP: tl.constexpr, IEEE: tl.constexpr,
    STOP_CHUNK: tl.constexpr, STOP_GROW: tl.constexpr, SUB_N: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Pass-2 walk over ``ceil(P / BLOCK_N)`` ranked key tiles; returns the state and visits.

    With EARLY_STOP the walk is a ``while`` loop over chunks of tiles with a software-pipelined
    ``for`` loop inside (Triton pipelines only ``for`` loops, which cannot break); the first
    chunk has STOP_CHUNK tiles, each next one STOP_GROW more (at most 64), so short walks waste
    little and long walks refill the pipeline rarely. The loads never depend on the stop decision,
    so the pipeliner can prefetch them; a tile after the stop is *dead*: its columns are all
    masked (``cols < P * go``), which makes its update the identity (``p = 0``, ``alpha = 1``),
    and it is not counted. Its products are wasted work, less than one chunk per walk (an ``if``
    around them would stop Triton 3.6 from pipelining the loop).

    KEEP_STOP (``stop_tile="keep"``, the paper's kernel): every live tile is added, and the
    per-row gain flags of tile ``j`` are reduced across rows at the start of tile ``j + 1``
    (the deferred check), while tile ``j``'s asynchronous ``P V`` product is still running,
    instead of between the two products of one tile.
    Otherwise (``"discard"``) the tile's own flags decide, before ``P V``, whether it is added.

    ``SUB_N < BLOCK_N`` (head_dim 256) computes each tile in ``SUB_N``-key parts
    (:func:`_sub_tiled_update`); the decisions are still per ``BLOCK_N`` tile. There the
    ``"keep"`` walk is :func:`_keep_walk_sub_tiled_lean`.
    With ``"discard"`` a first sweep of ``q k^T`` decides and a second one adds the tile (one
    more ``q k^T``).
    """
    n_tiles = tl.cdiv(P, BLOCK_N)
    if EARLY_STOP:
        visited = n_tiles * 0
        j0 = n_tiles * 0
        go = n_tiles > 0  # the walk is still live
        cols0 = tl.arange(0, BLOCK_N)
        chunk = n_tiles * 0 + STOP_CHUNK
        while go:
            # row flags of the previous tile (KEEP_STOP: checked one tile late); carried by the
            # for loop only (Triton 3.6 fails on an i1 tensor carried by the while loop), the
            # previous chunk's last flags were folded into ``go`` below
            gains = row_ok
            if SUB_N == BLOCK_N:
                for c in range(0, tl.minimum(chunk, n_tiles - j0)):
                    j = j0 + c
                    k, v, col_ok = _load_kv_tile(
                        K_head, V_head, KVP_row, stride_kl, stride_vl, j * BLOCK_N, P, BLOCK_N,
                        HEAD_D, GATHER,
                    )  # fmt: skip
                    if KEEP_STOP:  # the previous tile's decision, while its P V is in flight
                        go = go & (tl.max(gains.to(tl.int32), 0) > 0)
                    if EVEN:  # every column is a key: a dead tile is made the identity per row
                        s = _scores(q, k, qk_scale, cols0, BLOCK_N, IEEE, False)
                        m_new = tl.where(go, tl.maximum(m_i, tl.max(s, 1)), m_i)
                        p = tl.math.exp2(s - tl.where(go, m_new, float("inf"))[:, None])
                    else:
                        lim = P * go.to(tl.int32)  # 0 for a dead tile: every column masked
                        s = _scores(q, k, qk_scale, j * BLOCK_N + cols0, lim, IEEE)
                        m_new = tl.maximum(m_i, tl.max(s, 1))
                        p = tl.math.exp2(s - m_new[:, None])
                    alpha = tl.math.exp2(m_i - m_new)
                    gain = tl.sum(p, 1)
                    l_old = l_i * alpha
                    row_gains = (gain >= tau * l_old) & row_ok
                    visited += go.to(tl.int32)
                    if not KEEP_STOP:  # a discarded tile adds nothing: p = 0, state unscaled
                        take = go & (tl.max(row_gains.to(tl.int32), 0) > 0)
                        p = tl.where(take, p, 0.0)
                        alpha = tl.where(take, alpha, 1.0)
                        l_i = tl.where(take, l_old + gain, l_i)
                        m_i = tl.where(take, m_new, m_i)
                        go = take
                    # P V accumulates into the rescaled state inside the MMA
                    if IEEE:
                        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None],
                                     input_precision="ieee")  # fmt: skip
                    else:
                        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
                    if KEEP_STOP:
                        l_i = l_old + gain
                        m_i = m_new
                        gains = row_gains
            elif KEEP_STOP:
                m_i, l_i, acc, go, visited = _keep_walk_sub_tiled_lean(
                    q, m_i, l_i, acc, K_head, V_head, KVP_row, stride_kl, stride_vl, P, row_ok,
                    qk_scale, tau, go, visited, j0, tl.minimum(chunk, n_tiles - j0),
                    BLOCK_N, SUB_N, HEAD_D, GATHER, IEEE,
                )  # fmt: skip
            else:  # discard: decide first (q k^T only), then add the kept tile
                for c in range(0, tl.minimum(chunk, n_tiles - j0)):
                    j = j0 + c
                    visited += go.to(tl.int32)
                    lim = P * go.to(tl.int32)
                    m_x, l_x, acc_x, gain, l_old = _sub_tiled_update(
                        q, m_i, l_i, acc, K_head, V_head, KVP_row, stride_kl, stride_vl, j, P,
                        lim, qk_scale, BLOCK_N, SUB_N, HEAD_D, GATHER, IEEE, False,
                    )  # fmt: skip
                    go = go & (tl.max(((gain >= tau * l_old) & row_ok).to(tl.int32), 0) > 0)
                    lim = P * go.to(tl.int32)
                    m_i, l_i, acc, gain, l_old = _sub_tiled_update(
                        q, m_i, l_i, acc, K_head, V_head, KVP_row, stride_kl, stride_vl, j, P,
                        lim, qk_scale, BLOCK_N, SUB_N, HEAD_D, GATHER, IEEE, True,
                    )  # fmt: skip
            if KEEP_STOP and SUB_N == BLOCK_N:  # the sub-tiled walk folded it into go
                go = go & (tl.max(gains.to(tl.int32), 0) > 0)
            j0 += chunk
            chunk = tl.minimum(chunk + STOP_GROW, 64)
            go = go & (j0 < n_tiles)
    else:
        # no decisions: the walk is plain attention over SUB_N-key tiles
        for j in range(0, tl.cdiv(P, SUB_N)):
            k, v, col_ok = _load_kv_tile(
                K_head, V_head, KVP_row, stride_kl, stride_vl, j * SUB_N, P, SUB_N, HEAD_D, GATHER
            )
            m_i, l_i, acc = _tile_update(q, k, v, m_i, l_i, acc, qk_scale, col_ok[None, :],
                                         not EVEN, IEEE)  # fmt: skip
        visited = n_tiles
    return m_i, l_i, acc, visited


@triton.jit
def _program_tile(H, GROUP, BLOCK_M: tl.constexpr):
    """Grid ``(query tiles, B * Hq)``, the last query tile first (the longest work first):
    ``(tile, bh, b, h, hk, a)`` with ``a`` the tile's first row (or walk slot)."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    h = bh % H
    return tile, bh, bh // H, h, h // GROUP, tile * BLOCK_M


@triton.jit
def _ranked_len(seg_start, S, W, L, CAUSAL: tl.constexpr):
    """Keys a segment ranks (``P_n``): the causal prefix before the window, or (non-causal)
    every key outside the window and the own segment."""
    lo = tl.maximum(seg_start - W, 0)
    if CAUSAL:
        return lo
    return L - (tl.minimum(seg_start + S, L) - lo)


@triton.jit
def _walk_len(P, MAX_P, WALK_KEYS, seg, TOPK: tl.constexpr):
    """Ranked keys the walk visits: ``P`` cut to the walk budget and, in the top-k mode, to the
    segment's ``WALK_KEYS`` entry."""
    P = tl.minimum(P, MAX_P)
    if TOPK:
        P = tl.minimum(P, tl.load(WALK_KEYS + seg))
    return P


@triton.jit
def _tile_tau(tau, a, seg_start, S, L, TAIL, BLOCK_M: tl.constexpr):
    """The stop threshold of the query tile at walk slot ``a``: 0 (never stops) when the tile
    holds a slot of the dense tail ``[TAIL, L)`` (``dense_tail``; ``TAIL = L`` when off), else
    ``tau``. At ``tau = 0`` every valid row gains (``gain >= 0``), so the walk goes on."""
    last = tl.minimum(tl.minimum(a + BLOCK_M, seg_start + S), L)
    return tl.where(last > TAIL, 0.0, tau)


@triton.jit
def _walk_row(seg, a, seg_start, S, L, RANK_TAIL, TAIL_ROW, BLOCK_M: tl.constexpr):
    """The ``kv_perm`` row the query tile at walk slot ``a`` walks: its segment's, or
    (``tail_rank``) the segment's tail row ``seg + TAIL_ROW`` when the tile holds a slot of
    ``[RANK_TAIL, L)`` (``RANK_TAIL = L`` when off)."""
    last = tl.minimum(tl.minimum(a + BLOCK_M, seg_start + S), L)
    return tl.where(last > RANK_TAIL, seg + TAIL_ROW, seg)


@triton.jit
def _s2o_pass1_kernel(
    Q, K, V, K_desc, V_desc, M_buf, L_buf, O_buf,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl, stride_vb, stride_vh,
    stride_vl, L, H, GROUP, S, W, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, IEEE: tl.constexpr,
    USE_DESC: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """Dense intra-segment attention (causal or the whole segment) + local window -> ``(m2, l,
    o)`` buffers; BLOCK_N is the key sub-tile.

    Grid ``(cdiv(L, BLOCK_M), B * Hq)``; ``m2``, ``l`` are ``[B*Hq, L]`` fp32 and ``o = acc / l``
    is ``[B*Hq, L, D]`` in ``O_buf``'s dtype (the input dtype).
    """
    tile, bh, b, h, hk, a = _program_tile(H, GROUP, BLOCK_M)
    seg_start = (a // S) * S
    lo = tl.maximum(seg_start - W, 0)
    rows = a + tl.arange(0, BLOCK_M)
    row_ok = rows < L
    offs_d = tl.arange(0, HEAD_D)
    q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_ql
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    m_i, l_i, acc = _dense_part(
        q, m_i, l_i, acc, K + b * stride_kb + hk * stride_kh, V + b * stride_vb + hk * stride_vh,
        K_desc, V_desc, b.to(tl.int32), hk.to(tl.int32), stride_kl, stride_vl, rows, lo,
        tl.minimum(seg_start + S, L), a, L, qk_scale, BLOCK_M, BLOCK_N, HEAD_D, IEEE, USE_DESC,
        CAUSAL,
    )  # fmt: skip
    st = bh * L + rows
    tl.store(M_buf + st, m_i, mask=row_ok)
    tl.store(L_buf + st, l_i, mask=row_ok)
    o = acc / l_i[:, None]  # every valid row sees at least its own key: l >= 1
    tl.store(O_buf + st[:, None] * HEAD_D + offs_d[None, :], o.to(O_buf.dtype.element_ty),
             mask=row_ok[:, None])  # fmt: skip


@triton.jit
def _s2o_pass2_kernel(
    Q, K, V, O, QP, KVP, M_buf, L_buf, O_buf, VISITED, WALK_KEYS,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl: tl.constexpr, stride_vb,
    stride_vh, stride_vl: tl.constexpr, stride_pb, stride_ph, stride_pn, L, H, GROUP, S, W,
    N_TILES, qk_scale, tau, MAX_P,
    TAIL, RANK_TAIL, TAIL_ROW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    USE_QPERM: tl.constexpr, GATHER: tl.constexpr, EARLY_STOP: tl.constexpr,
    KEEP_STOP: tl.constexpr, IEEE: tl.constexpr,
    STOP_CHUNK: tl.constexpr, STOP_GROW: tl.constexpr, SUB_N: tl.constexpr, CAUSAL: tl.constexpr,
    TOPK: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Ranked walk with early stop for one query tile of ``Q_perm`` order; scatters the output.

    Query tile ``tile`` covers walk slots ``[tile*BM, tile*BM + BM)`` of its segment; row ``r``'s
    position is ``q_perm[b, h, tile*BM + r]`` (identity without USE_QPERM). Key tile ``j`` is
    ``kv_perm[b, h, n, j*BN : (j+1)*BN]`` (``n``: :func:`_walk_row`). ``VISITED[b*Hq + h, tile]``
    gets the tiles visited.
    """
    tile, bh, b, h, hk, a = _program_tile(H, GROUP, BLOCK_M)
    seg = a // S
    seg_start = seg * S
    P = _walk_len(_ranked_len(seg_start, S, W, L, CAUSAL), MAX_P, WALK_KEYS, seg, TOPK)
    slots = a + tl.arange(0, BLOCK_M)
    row_ok = slots < tl.minimum(seg_start + S, L)
    if USE_QPERM:
        pos = tl.load(QP + bh * L + slots, mask=row_ok, other=0).to(tl.int64)
    else:
        pos = slots.to(tl.int64)
    offs_d = tl.arange(0, HEAD_D)
    q_ptrs = Q + b * stride_qb + h * stride_qh + pos[:, None] * stride_ql + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    st = bh * L + pos
    m1 = tl.load(M_buf + st, mask=row_ok, other=0.0)
    l1 = tl.load(L_buf + st, mask=row_ok, other=1.0)
    o1 = tl.load(O_buf + st[:, None] * HEAD_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    acc = o1.to(tl.float32) * l1[:, None]
    m_i, l_i, acc, visited = _ranked_walk(
        q, m1, l1, acc, K + b * stride_kb + hk * stride_kh, V + b * stride_vb + hk * stride_vh,
        KVP + b * stride_pb + h * stride_ph
        + _walk_row(seg, a, seg_start, S, L, RANK_TAIL, TAIL_ROW, BLOCK_M) * stride_pn,
        stride_kl, stride_vl, P, row_ok,
        qk_scale, _tile_tau(tau, a, seg_start, S, L, TAIL, BLOCK_M), BLOCK_M, BLOCK_N, HEAD_D,
        GATHER, EARLY_STOP, KEEP_STOP, IEEE, STOP_CHUNK,
        STOP_GROW, SUB_N, EVEN,
    )  # fmt: skip
    tl.store(VISITED + bh * N_TILES + tile, visited)
    out = acc / l_i[:, None]
    o_ptrs = O + bh * L * HEAD_D + pos[:, None] * HEAD_D + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _s2o_fused_kernel(
    Q, K, V, K_desc, V_desc, O, KVP, VISITED, WALK_KEYS,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl: tl.constexpr, stride_vb,
    stride_vh, stride_vl: tl.constexpr, stride_pb, stride_ph, stride_pn, L, H, GROUP, S, W,
    N_TILES, qk_scale, tau, MAX_P,
    TAIL, RANK_TAIL, TAIL_ROW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    GATHER: tl.constexpr,
    EARLY_STOP: tl.constexpr, KEEP_STOP: tl.constexpr, IEEE: tl.constexpr,
    STOP_CHUNK: tl.constexpr, STOP_GROW: tl.constexpr, USE_DESC: tl.constexpr,
    SUB_N: tl.constexpr, CAUSAL: tl.constexpr, TOPK: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Single pass, original query order: Pass-1 + window + ranked walk on one register state."""
    tile, bh, b, h, hk, a = _program_tile(H, GROUP, BLOCK_M)
    seg = a // S
    seg_start = seg * S
    lo = tl.maximum(seg_start - W, 0)
    rows = a + tl.arange(0, BLOCK_M)
    row_ok = rows < L
    offs_d = tl.arange(0, HEAD_D)
    q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_ql
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_head = K + b * stride_kb + hk * stride_kh
    v_head = V + b * stride_vb + hk * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    m_i, l_i, acc = _dense_part(
        q, m_i, l_i, acc, k_head, v_head, K_desc, V_desc, b.to(tl.int32), hk.to(tl.int32),
        stride_kl, stride_vl, rows, lo, tl.minimum(seg_start + S, L), a, L, qk_scale, BLOCK_M,
        SUB_N, HEAD_D, IEEE, USE_DESC, CAUSAL,
    )  # fmt: skip
    m_i, l_i, acc, visited = _ranked_walk(
        q, m_i, l_i, acc, k_head, v_head,
        KVP + b * stride_pb + h * stride_ph
        + _walk_row(seg, a, seg_start, S, L, RANK_TAIL, TAIL_ROW, BLOCK_M) * stride_pn,
        stride_kl, stride_vl,
        _walk_len(_ranked_len(seg_start, S, W, L, CAUSAL), MAX_P, WALK_KEYS, seg, TOPK), row_ok,
        qk_scale, _tile_tau(tau, a, seg_start, S, L, TAIL, BLOCK_M), BLOCK_M, BLOCK_N, HEAD_D,
        GATHER, EARLY_STOP, KEEP_STOP, IEEE, STOP_CHUNK,
        STOP_GROW, SUB_N, EVEN,
    )  # fmt: skip
    tl.store(VISITED + bh * N_TILES + tile, visited)
    out = acc / l_i[:, None]
    o_ptrs = O + bh * L * HEAD_D + rows[:, None].to(tl.int64) * HEAD_D + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])


def _keep(stop_tile: str) -> bool:
    if stop_tile not in ("keep", "discard"):
        raise ValueError(f"stop_tile must be 'keep' or 'discard', got {stop_tile!r}")
    return stop_tile == "keep"


def _max_prefix(walk_budget: int | None, block_n: int, seq_len: int) -> int:
    """Longest ranked prefix a walk may visit: ``walk_budget`` tiles, or all of it."""
    return seq_len if walk_budget is None else min(walk_budget * block_n, seq_len)


def _walk_keys(L, segment_len, local_window, block_n, walk_budget, topk_ratio, causal, tau,
               device) -> torch.Tensor | None:  # fmt: skip
    """Top-k mode: ``[N]`` int32 ranked keys each segment's walk may visit (``None`` when
    ``topk_ratio`` is None). Refuses ``tau > 0``: the top-k mode has no early stop."""
    if topk_ratio is None:
        return None
    refuse_topk_with_early_stop(topk_ratio, tau)
    return _walk_keys_table(L, segment_len, local_window, block_n, walk_budget, float(topk_ratio),
                            bool(causal), device)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _walk_keys_table(L, segment_len, local_window, block_n, walk_budget, topk_ratio, causal,
                     device) -> torch.Tensor:  # fmt: skip
    """The table, made once per geometry and device: a repeated (timed) call does no host-to-device
    copy, which would wait for the GPU. Nothing writes into it."""
    tiles = [s2o_walk_tiles(L, s, segment_len, local_window, block_n, walk_budget, topk_ratio,
                            causal) for s in range(0, L, segment_len)]  # fmt: skip
    return torch.tensor([t * block_n for t in tiles], dtype=torch.int32, device=device)


def _even(segment_len, local_window, block_n, walk_budget, walk_keys, causal) -> bool:
    """Whether every ranked key tile of every walk is full (``EVEN``): a causal prefix
    ``n*S - W`` of whole tiles, no walk budget or top-k cut. The walk then skips the per-element
    column mask (a dead tile is made the identity per row): the same decisions with fewer
    instructions a tile."""
    return (bool(causal) and segment_len % block_n == 0 and local_window % block_n == 0
            and walk_budget is None and walk_keys is None)  # fmt: skip


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _kv_strides(kv_perm: torch.Tensor) -> tuple[int, int, int]:
    return kv_perm.stride(0), kv_perm.stride(1), kv_perm.stride(2)


def _prep(q, k, v, scale):
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    D = q.shape[-1]
    check_head_dim(D)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    return q, k, v, scale * LOG2E, q.dtype == torch.float32


def s2o_pass1(
    q, k, v, *, segment_len, local_window, block_m, block_n, scale=None, causal=True,
    launch: Launch | None = None, descriptors: bool | None = None,
):  # fmt: skip
    """Pass-1 state in original order: ``m2 [B*Hq, L]`` and ``l [B*Hq, L]`` fp32, and the
    normalized partial output ``o = acc / l`` ``[B*Hq, L, D]`` in q's dtype (half the bytes of an
    fp32 ``acc``; Pass-2 restores ``acc = o * l``). ``causal=False``: each query sees its whole
    segment. ``launch``: :class:`~s2o.kernels.launch.Launch` (``sub_n`` is Pass-1's key tile);
    ``descriptors``: TMA loads of the K/V tiles (None: automatic, see :mod:`s2o.kernels.tma`)."""
    q, k, v, qk_scale, ieee = _prep(q, k, v, scale)
    B, Hq, L, D = q.shape
    sub_n, cfg = resolve_launch("pass1", launch, head_d=D, block_n=block_n, device=q.device)
    m = torch.empty(B * Hq, L, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    o = torch.empty(B * Hq, L, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(L, block_m), B * Hq)
    descs, use_desc = kernel_kv_args(k, v, sub_n, descriptors)
    _s2o_pass1_kernel[grid](
        q, k, v, *descs, m, l, o, *_strides(q), *_strides(k), *_strides(v), L, Hq,
        Hq // k.shape[1], segment_len, local_window, qk_scale, BLOCK_M=block_m, BLOCK_N=sub_n,
        HEAD_D=D, IEEE=ieee, USE_DESC=use_desc, CAUSAL=bool(causal), **cfg,
    )  # fmt: skip
    return m, l, o


def _discard_stages(cfg: dict, launch: Launch | None, two_sweeps: bool) -> dict:
    """``stop_tile="discard"`` with key sub-tiles sweeps each tile twice (decide, then add):
    staging both sweeps' sub-tiles exceeds an H100's shared memory at head_dim 256, so it runs
    unpipelined unless ``launch`` names ``num_stages``."""
    if two_sweeps and "num_stages" in cfg and (launch is None or launch.num_stages is None):
        return {**cfg, "num_stages": 1}
    return cfg


def _rank_tail(L: int, segment_len: int, tail_rank: int, kv_perm: torch.Tensor):
    """``(RANK_TAIL, TAIL_ROW)`` of the walking kernels: the first tail slot (``L``: off) and the
    offset from a segment's ``kv_perm`` row to its tail row; refuses a ``kv_perm`` without them."""
    n0, n_tail = tail_rows(L, segment_len, tail_rank)
    want = n0 + 2 * n_tail  # N = n0 + n_tail segment rows, then n_tail tail rows
    if tail_rank and kv_perm.shape[2] != want:
        raise ValueError(
            f"kv_perm has {kv_perm.shape[2]} rows, tail_rank={tail_rank} needs {want} (N "
            f"segments + the tail's own rows): make perms with Step 1's tail_rank={tail_rank}"
        )
    return tail_start(L, tail_rank), n_tail


def _walk_buffers(q, k, v, kv_perm, scale, block_m, out):
    """Inputs of a walking kernel: ``(_prep(...), out, visited, kv_perm)`` (an empty ``kv_perm``
    becomes a dummy that is never read)."""
    prepped = _prep(q, k, v, scale)
    q = prepped[0]
    B, Hq, L, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    visited = torch.empty(B, Hq, triton.cdiv(L, block_m), dtype=torch.int32, device=q.device)
    kvp = kv_perm if kv_perm.numel() else kv_perm.new_zeros(B, Hq, 1, 1)
    return prepped, out, visited, kvp


def s2o_pass2(
    q, k, v, state, q_perm, kv_perm, *, segment_len, local_window, block_m, block_n, tau,
    scale=None, use_qperm=True, gather=True, early_stop=None, stop_tile="keep", out=None,
    walk_budget=None, causal=True, launch: Launch | None = None,
    stop_chunk: tuple[int, int] | None = None, topk_ratio: float | None = None,
    dense_tail: int = 0, tail_rank: int = 0,
):  # fmt: skip
    """Pass-2: ``(out [B, Hq, L, D], visited [B, Hq, cdiv(L, block_m)] int32)``.

    ``q_perm`` ``[B, Hq, L]`` and ``kv_perm`` ``[B, Hq, N, P_max]``, int64 or int32 (step 1's
    layout). ``early_stop=None`` means ``tau > 0``; True with ``tau <= 0`` runs the stop-rule
    control flow without ever stopping (overhead decomposition D). ``stop_tile``: ``"keep"`` or
    ``"discard"`` the tile that triggers the stop (same decisions and visits). ``walk_budget``:
    at most that many key tiles per query tile (``None``: no cap). ``causal=False``: row ``n`` of
    ``kv_perm`` ranks every key outside the window and the own segment. ``launch``: see
    :class:`~s2o.kernels.launch.Launch`; ``stop_chunk``: ``(first chunk, growth)`` of the
    early-stop walk, default :data:`STOP_CHUNK`. ``topk_ratio``: S2O's top-k mode, each query
    tile walks the first ``ceil(topk_ratio * ranked tiles)`` key tiles (needs ``tau <= 0``).
    ``dense_tail``: the query tiles holding walk slots ``>= L - dense_tail`` never stop
    (:mod:`s2o.dense_tail`; ``q_perm`` must come from Step 1 with the same ``dense_tail``).
    ``tail_rank``: the query tiles holding walk slots ``>= L - tail_rank`` walk their segment's
    tail row of ``kv_perm`` (:mod:`s2o.tail_rank`; both perms from Step 1 with the same
    ``tail_rank``).
    """
    (q, k, v, qk_scale, ieee), out, visited, kvp = _walk_buffers(
        q, k, v, kv_perm, scale, block_m, out
    )
    B, Hq, L, D = q.shape
    n_tiles = visited.shape[-1]
    early_stop = tau > 0 if early_stop is None else early_stop
    chunk, grow = _stop_chunk(stop_chunk)
    sub_n, cfg = resolve_launch(
        "pass2", launch, head_d=D, block_n=block_n, device=q.device, gather=gather
    )
    cfg = _discard_stages(cfg, launch, sub_n < block_n and early_stop and not _keep(stop_tile))
    m, l, o1 = state
    walk_keys = _walk_keys(L, segment_len, local_window, block_n, walk_budget, topk_ratio, causal,
                           tau, q.device)  # fmt: skip
    even = _even(segment_len, local_window, block_n, walk_budget, walk_keys, causal)

    def scope():  # built only where the Gluon walk may take the call
        cap = torch.cuda.get_device_capability(q.device) if q.is_cuda else None
        return dict(capability=cap, dtype=q.dtype, head_d=D, block_m=block_m, block_n=block_n,
                    even=even, keep=_keep(stop_tile), use_qperm=use_qperm, gather=gather,
                    kv_dtype=kvp.dtype, dense_tail=dense_tail, tail_rank=tail_rank,
                    launch=launch)  # fmt: skip

    if _gluon_walk(launch, scope, (q, k, v)):
        from . import gluon_walk

        gluon_walk.launch_walk(
            q, k, v, out, q_perm.contiguous(), kvp, state, visited, segment_len=segment_len,
            local_window=local_window, qk_scale=qk_scale, tau=tau, early_stop=early_stop,
            stages=(launch and launch.num_stages) or gluon_walk.STAGES[0],
        )  # fmt: skip
        return out, visited
    _s2o_pass2_kernel[(n_tiles, B * Hq)](
        q, k, v, out, q_perm.contiguous(), kvp, m, l, o1, visited,
        visited if walk_keys is None else walk_keys,
        *_strides(q), *_strides(k), *_strides(v), *_kv_strides(kvp), L, Hq, Hq // k.shape[1],
        segment_len, local_window, n_tiles, qk_scale, float(tau),
        _max_prefix(walk_budget, block_n, L), tail_start(L, dense_tail),
        *_rank_tail(L, segment_len, tail_rank, kv_perm), BLOCK_M=block_m,
        BLOCK_N=block_n, HEAD_D=D, USE_QPERM=use_qperm, GATHER=gather, EARLY_STOP=early_stop,
        KEEP_STOP=_keep(stop_tile), IEEE=ieee, STOP_CHUNK=chunk, STOP_GROW=grow, SUB_N=sub_n,
        CAUSAL=bool(causal), TOPK=walk_keys is not None, EVEN=even, **cfg,
    )  # fmt: skip
    return out, visited


def _gluon_walk(launch: Launch | None, scope, qkv) -> bool:
    """Whether Pass-2 walks in Gluon (:mod:`.gluon_walk`). ``launch.walk``: ``"triton"`` no,
    ``"gluon"`` yes or refused naming why its scope does not take the call; unset, wherever the
    scope (``scope()``: device capability, dtypes, geometry, launch) takes it, the faster walk on
    Hopper (``benchmarks.kernel_probe``'s ``pass2`` and ``pass2_gluon`` rows)."""
    walk = None if launch is None else launch.walk
    if walk == "triton":
        return False
    try:
        from . import gluon_walk
    except ImportError as e:  # a Triton without Gluon's cp.async and wgmma (before 3.5)
        why = f"needs Triton's Gluon with cp.async and wgmma (3.5 or later): {e}"
    else:
        why = gluon_walk.unsupported(**scope(), aligned=gluon_walk.aligned(*qkv))
    if why is not None and walk == "gluon":
        raise ValueError(f"launch walk='gluon': the Gluon walk {why}")
    return why is None


def s2o_fused(
    q, k, v, kv_perm, *, segment_len, local_window, block_m, block_n, tau, scale=None,
    gather=True, early_stop=None, stop_tile="keep", out=None, walk_budget=None, causal=True,
    launch: Launch | None = None, stop_chunk: tuple[int, int] | None = None,
    descriptors: bool | None = None, topk_ratio: float | None = None,
    dense_tail: int = 0, tail_rank: int = 0,
):  # fmt: skip
    """Fused single pass (no query reordering): ``(out, visited)`` as :func:`s2o_pass2`
    (``topk_ratio``, ``dense_tail`` and ``tail_rank`` too); ``launch.sub_n``
    is also the key tile of its dense part, ``descriptors`` as :func:`s2o_pass1`."""
    (q, k, v, qk_scale, ieee), out, visited, kvp = _walk_buffers(
        q, k, v, kv_perm, scale, block_m, out
    )
    B, Hq, L, D = q.shape
    n_tiles = visited.shape[-1]
    early_stop = tau > 0 if early_stop is None else early_stop
    chunk, grow = _stop_chunk(stop_chunk)
    sub_n, cfg = resolve_launch("fused", launch, head_d=D, block_n=block_n, device=q.device)
    cfg = _discard_stages(cfg, launch, sub_n < block_n and early_stop and not _keep(stop_tile))
    descs, use_desc = kernel_kv_args(k, v, sub_n, descriptors)
    walk_keys = _walk_keys(L, segment_len, local_window, block_n, walk_budget, topk_ratio, causal,
                           tau, q.device)  # fmt: skip
    _s2o_fused_kernel[(n_tiles, B * Hq)](
        q, k, v, *descs, out, kvp, visited, visited if walk_keys is None else walk_keys,
        *_strides(q), *_strides(k), *_strides(v),
        *_kv_strides(kvp), L, Hq, Hq // k.shape[1], segment_len, local_window, n_tiles, qk_scale,
        float(tau), _max_prefix(walk_budget, block_n, L), tail_start(L, dense_tail),
        *_rank_tail(L, segment_len, tail_rank, kv_perm), BLOCK_M=block_m, BLOCK_N=block_n,
        HEAD_D=D, GATHER=gather, EARLY_STOP=early_stop, KEEP_STOP=_keep(stop_tile), IEEE=ieee,
        STOP_CHUNK=chunk, STOP_GROW=grow, USE_DESC=use_desc, SUB_N=sub_n, CAUSAL=bool(causal),
        TOPK=walk_keys is not None,
        EVEN=_even(segment_len, local_window, block_n, walk_budget, walk_keys, causal), **cfg,
    )  # fmt: skip
    return out, visited
