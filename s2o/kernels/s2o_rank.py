"""Exact ranking of Step 1's key scores in Triton: sample splitters, buckets, one bitonic sort each.

Step 1 ranks, for every (batch, head, segment) row, the ``P_n`` keys of its prefix by descending
fp32 score with ties in ascending position (a stable descending argsort). ``torch.sort`` does that
with cub's segmented radix sort, which moves fp32 keys plus int64 indices through about six passes
(~110 B per key measured). This module does the same ranking in three kernels over one chunk of
segments (a ``[B*Hq, n_segments, width]`` fp32 score rectangle):

1. ``_s2o_rank_samples_kernel``: per row, ``spb`` stratified pseudo-random samples per bucket, sorted;
   every ``spb``-th sample is a splitter, giving ``nb = cdiv(P_n, E)`` buckets of ~``E`` keys.
2. ``_s2o_rank_scatter_kernel``: every key finds its bucket by binary search over the splitters and
   takes a slot with an atomic counter (the order inside a bucket does not matter yet).
3. ``_s2o_rank_sort_kernel``: every bucket is sorted with ``tl.sort`` (``CAP = 2 E`` slots) and its
   positions are written at the bucket's offset in the row of ``kv_perm``; the rest of the row is
   set to ``-1``.

Score and position are packed into one int64 (:func:`_packed_key`) whose ascending order is exactly
the specification's order, so every key is unique and a plain (unstable) sort is exact; the result
does not depend on the slot order of step 2. A bucket that received more than ``CAP`` keys (with 64
samples per bucket, a bucket exceeds twice its expected size with probability ~1e-10) is ranked by a
slower exact path that streams the row in windows of ``CAP`` keys; tests force it with few samples.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SENTINEL = tl.constexpr(2**63 - 1)  # above every packed key (largest real high word: 0x7F800000)
_BELOW = tl.constexpr(-(2**63))  # below every packed key
# defaults (H200 tuning in benchmarks/bench_s2o.py --step1-breakdown)
RANK_CONFIG = {"cap": 4096, "samples_per_bucket": 64, "max_samples": 16384, "tile": 1024,
               "sort_warps": 8, "scatter_warps": 4}  # fmt: skip


@triton.jit
def _packed_key(score, pos):
    """int64 whose ascending order is descending ``score`` (fp32), then ascending ``pos``.

    ``-0.0`` ranks as ``+0.0`` and NaN above ``+inf``, as in ``torch.sort(descending=True)``.
    """
    b = score.to(tl.int32, bitcast=True)
    asc = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # order-preserving map of fp32 bits onto int32
    asc = tl.where((b & 0x7FFFFFFF) == 0, 0, asc)
    asc = tl.where(score != score, 2147483647, asc)
    desc = -1 - asc
    return (desc.to(tl.int64) << 32) | pos.to(tl.int64)


@triton.jit
def _row_geometry(n, S, W, E: tl.constexpr, SPB: tl.constexpr, MAXS: tl.constexpr):
    """Ranked prefix ``P``, bucket count ``nb`` and samples per bucket ``spb`` of segment ``n``."""
    P = tl.maximum(n * S - W, 0)
    nb = tl.cdiv(P, E)
    spb = tl.minimum(SPB, MAXS // tl.maximum(nb, 1))
    return P, nb, spb


@triton.jit
def _chunk_slot_offset(n0, nl, S, W, E: tl.constexpr, CAP: tl.constexpr):
    """Bucket slots of the chunk's segments before local segment ``nl`` (``CAP`` per bucket)."""
    acc = 0
    for i in range(0, nl):
        acc += tl.cdiv(tl.maximum((n0 + i) * S - W, 0), E)
    return acc.to(tl.int64) * CAP


@triton.jit
def _mix(x):
    """A cheap integer hash on non-negative int64 (< 2**31 after masking); no overflow."""
    x = ((x ^ (x >> 15)) * 2246822519) & 0x7FFFFFFF
    x = ((x ^ (x >> 13)) * 3266489917) & 0x7FFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _s2o_rank_samples_kernel(
    SC, SMP, stride_sb, stride_sn, n0, nc, S, W, SEED,
    E: tl.constexpr, SPB: tl.constexpr, MAXS: tl.constexpr,
):  # fmt: skip
    """One program per row: ``SMP[row, :m]`` = sorted packed keys of ``m = nb * spb`` samples."""
    pid = tl.program_id(0)
    bh = pid // nc
    nl = pid % nc
    P, nb, spb = _row_geometry(n0 + nl, S, W, E, SPB, MAXS)
    if nb > 1:
        m = nb * spb
        j = tl.arange(0, MAXS).to(tl.int64)
        ok = j < m
        lo = j * P // m  # stratum j of the row; m <= P, so every stratum is non-empty
        span = tl.maximum((j + 1) * P // m - lo, 1)
        h = _mix((j * 2654435761 + pid.to(tl.int64) * 40503 + SEED) & 0x7FFFFFFF)
        pos = lo + h % span
        row_sc = SC + bh.to(tl.int64) * stride_sb + nl.to(tl.int64) * stride_sn
        s = tl.load(row_sc + pos, mask=ok, other=0.0)
        key = tl.where(ok, _packed_key(s, pos), SENTINEL)
        tl.store(SMP + pid.to(tl.int64) * MAXS + j, tl.sort(key))


@triton.jit
def _bucket_of(key, row_smp, nb, spb, ok, LOG_NB: tl.constexpr):
    """Number of splitters ``<= key`` (splitter ``i`` is sample ``(i + 1) * spb``): the bucket."""
    base = tl.zeros(key.shape, dtype=tl.int32)
    ln = tl.zeros(key.shape, dtype=tl.int32) + (nb - 1)
    for _ in tl.static_range(LOG_NB):
        half = ln // 2
        probe = base + half
        live = ok & (ln > 0)
        v = tl.load(row_smp + (probe + 1).to(tl.int64) * spb, mask=live, other=SENTINEL)
        right = live & (v <= key)
        base = tl.where(right, probe + 1, base)
        ln = tl.where(right, ln - half - 1, half)
    return base


@triton.jit
def _s2o_rank_scatter_kernel(
    SC, SMP, CNT, BUF, stride_sb, stride_sn, n0, nc, S, W, head_slots,
    E: tl.constexpr, SPB: tl.constexpr, MAXS: tl.constexpr, NBM: tl.constexpr,
    CAP: tl.constexpr, TILE: tl.constexpr, LOG_NB: tl.constexpr,
):  # fmt: skip
    """Program (tile, row): bucket and slot for ``TILE`` keys; ``BUF`` gets the packed keys."""
    t = tl.program_id(0)
    pid = tl.program_id(1)
    bh = pid // nc
    nl = pid % nc
    P, nb, spb = _row_geometry(n0 + nl, S, W, E, SPB, MAXS)
    if t * TILE < P:
        cols = t * TILE + tl.arange(0, TILE)
        ok = cols < P
        row_sc = SC + bh.to(tl.int64) * stride_sb + nl.to(tl.int64) * stride_sn
        key = _packed_key(tl.load(row_sc + cols, mask=ok, other=0.0), cols)
        bucket = _bucket_of(key, SMP + pid.to(tl.int64) * MAXS, nb, spb, ok, LOG_NB)
        slot = tl.atomic_add(CNT + pid * NBM + bucket, 1, mask=ok, sem="relaxed")
        base = bh.to(tl.int64) * head_slots + _chunk_slot_offset(n0, nl, S, W, E, CAP)
        dst = BUF + base + bucket.to(tl.int64) * CAP + slot
        tl.store(dst, key, mask=ok & (slot < CAP))


@triton.jit
def _rank_overflowed_bucket(row_sc, row_smp, out_row, P, nb, spb, b, start, c, CAP: tl.constexpr):
    """Exact ranks of a bucket with ``c > CAP`` keys: windows of the ``CAP`` smallest keys above
    the last window, each found by streaming the whole row (bitonic merge of two sorted halves)."""
    i = tl.arange(0, CAP)
    lo_key = tl.load(row_smp + b.to(tl.int64) * spb, mask=b > 0, other=_BELOW)
    hi_key = tl.load(row_smp + (b + 1).to(tl.int64) * spb, mask=b < nb - 1, other=SENTINEL)
    done = 0
    last = lo_key
    found = 1
    while (done < c) & (found > 0):
        best = tl.full([CAP], SENTINEL, tl.int64)
        for t0 in range(0, P, CAP):
            cols = t0 + i
            ok = cols < P
            key = _packed_key(tl.load(row_sc + cols, mask=ok, other=0.0), cols)
            member = ok & (key >= lo_key) & (key < hi_key) & ((key > last) | (done == 0))
            key = tl.sort(tl.where(member, key, SENTINEL), descending=True)
            best = tl.sort(tl.minimum(best, key))  # the CAP smallest of both
        valid = best != SENTINEL
        found = tl.sum(valid.to(tl.int32))
        tl.store(out_row + start + done + i, best.to(tl.int32).to(out_row.dtype.element_ty), mask=valid)
        last = tl.max(tl.where(valid, best, _BELOW))
        done += found


@triton.jit
def _s2o_rank_sort_kernel(
    SC, SMP, CNT, BUF, OUT, stride_sb, stride_sn, n0, nc, N, S, W, head_slots, p_max,
    E: tl.constexpr, SPB: tl.constexpr, MAXS: tl.constexpr, NBM: tl.constexpr,
    CAP: tl.constexpr,
):  # fmt: skip
    """Program (bucket, row): sort bucket ``b`` into ``OUT`` at its offset; ``-1`` padding."""
    b = tl.program_id(0)
    pid = tl.program_id(1)
    bh = pid // nc
    nl = pid % nc
    P, nb, spb = _row_geometry(n0 + nl, S, W, E, SPB, MAXS)
    out_row = OUT + (bh.to(tl.int64) * N + n0 + nl) * p_max
    i = tl.arange(0, CAP)
    if b < nb:
        j = tl.arange(0, NBM)
        start = tl.sum(tl.load(CNT + pid * NBM + j, mask=j < b, other=0))
        c = tl.load(CNT + pid * NBM + b)
        if c <= CAP:
            base = bh.to(tl.int64) * head_slots + _chunk_slot_offset(n0, nl, S, W, E, CAP)
            key = tl.load(BUF + base + b.to(tl.int64) * CAP + i, mask=i < c, other=SENTINEL)
            key = tl.sort(key)
            tl.store(out_row + start + i, key.to(tl.int32).to(OUT.dtype.element_ty), mask=i < c)
        else:
            row_sc = SC + bh.to(tl.int64) * stride_sb + nl.to(tl.int64) * stride_sn
            row_smp = SMP + pid.to(tl.int64) * MAXS
            _rank_overflowed_bucket(row_sc, row_smp, out_row, P, nb, spb, b, start, c, CAP)
    pad = P + b.to(tl.int64) * CAP + i
    tl.store(out_row + pad, tl.full([CAP], -1, OUT.dtype.element_ty), mask=pad < p_max)


def rank_prefix_chunk(
    scores: torch.Tensor,
    kv_perm: torch.Tensor,
    *,
    first_segment: int,
    segment_len: int,
    local_window: int,
    config: dict | None = None,
) -> torch.Tensor:
    """Write the ranked prefixes of one chunk of segments into ``kv_perm`` (values and padding).

    Args:
        scores: ``[BH, nc, width]`` fp32 (last dim contiguous): row ``(bh, j)`` scores keys
            ``0..P_n-1`` of segment ``n = first_segment + j`` (columns past ``P_n`` are ignored).
        kv_perm: ``[BH, N, P_max]`` int64 or int32, contiguous; rows ``first_segment ..
            first_segment + nc - 1`` are written completely.
        config: overrides of :data:`RANK_CONFIG` (tests force the overflow path with few samples).
    Returns:
        The ``[BH * nc, NBM]`` int32 bucket sizes (for tests: a size above ``cap`` took the slow
        exact path).
    """
    cfg = {**RANK_CONFIG, **(config or {})}
    BH, nc, width = scores.shape
    _, N, p_max = kv_perm.shape
    S, W, spb = segment_len, local_window, cfg["samples_per_bucket"]
    if scores.stride(2) != 1 or not kv_perm.is_contiguous() or cfg["cap"] < 4 * spb:
        raise ValueError(f"rank_prefix_chunk: need contiguous rows and cap >= 4 * spb, got {cfg}")
    prefix = [max(0, (first_segment + j) * S - W) for j in range(nc)]
    # short prefixes: a smaller bitonic sort (at least 4 * spb so that m <= P holds)
    cap = min(cfg["cap"], max(4 * spb, triton.next_power_of_2(prefix[-1])))
    E = cap // 2
    nb_max = triton.cdiv(prefix[-1], E)
    nbm = triton.next_power_of_2(max(nb_max, 1))
    maxs = max(nbm, min(cfg["max_samples"], triton.next_power_of_2(nb_max * spb)))
    head_slots = cap * sum(triton.cdiv(p, E) for p in prefix)
    cnt = torch.zeros(BH * nc, nbm, dtype=torch.int32, device=scores.device)
    smp = torch.empty(BH * nc, maxs, dtype=torch.int64, device=scores.device)
    buf = torch.empty(BH * head_slots, dtype=torch.int64, device=scores.device)
    geo = dict(E=E, SPB=spb, MAXS=maxs)
    strides = (scores.stride(0), scores.stride(1))
    _s2o_rank_samples_kernel[(BH * nc,)](
        scores, smp, *strides, first_segment, nc, S, W, 12345, **geo, num_warps=cfg["sort_warps"]
    )
    tile = cfg["tile"]
    _s2o_rank_scatter_kernel[(triton.cdiv(prefix[-1], tile), BH * nc)](
        scores, smp, cnt, buf, *strides, first_segment, nc, S, W, head_slots, **geo, NBM=nbm,
        CAP=cap, TILE=tile, LOG_NB=max(1, nb_max.bit_length()), num_warps=cfg["scatter_warps"],
    )  # fmt: skip
    _s2o_rank_sort_kernel[(max(1, triton.cdiv(p_max, E)), BH * nc)](
        scores, smp, cnt, buf, kv_perm, *strides, first_segment, nc, N, S, W, head_slots, p_max,
        **geo, NBM=nbm, CAP=cap, num_warps=cfg["sort_warps"],
    )  # fmt: skip
    return cnt
