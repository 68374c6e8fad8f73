"""Step 1's key sort (used by :mod:`s2o.kernels.s2o_step1`): which segments' keys one sort call
ranks (the sort policy, :func:`_sort_groups`), the packing of fp32 scores into the uint32 keys and
row/position values of the CUB radix sort (:func:`_desc_key`, :func:`_s2o_cub_keys_kernel`), and
the placing of each sorted row into ``kv_perm`` with its ``-1`` padding (:func:`_s2o_place_kernel`).
:func:`_rank_chunk` runs one group: ``torch.sort`` of its score rectangle, or two CUB radix sorts
(:mod:`s2o.kernels.cub_sort`) of its packed keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cub_sort import rank_rows

# at most this many key-sort rectangles in sort_mode "chunks"; padding waste ~ 1 / (2 * chunks)
_MAX_SORT_CHUNKS = 8
# below this many keys (all heads) Step 1 is bound by the host (measured on an H200 at L <= 32K),
# so "chunks" sorts them in one group (its padding is cheaper than more launches); "cub" (no
# padding) puts at least this many keys in each group (measured: results/kernels/run8)
_MIN_GROUP_KEYS = 1 << 23
# defaults of s2o_step1's sort_mode and index_dtype (the times of each:
# results/kernels/run8/step1_probe_07f2549.json). "cub" is not the default because it compiles a
# CUDA extension on first use (needs nvcc); callers that want it pass sort_mode="cub" (the S2O
# method: step1_sort).
SORT_MODE, INDEX_DTYPE = "chunks", torch.int64
_SORT_MODES = ("chunks", "full", "cub")


@triton.jit
def _keys_before(n0, n, S, W):
    """Keys of segments ``n0 .. n - 1`` of one head, ``sum max(0, i*S - W)`` (int64; ``n >= n0``,
    scalars or a tensor ``n``) in closed form: an arithmetic series from the first segment with
    ``i*S >= W``."""
    z = tl.full([], 0, tl.int64)  # Triton passes an int 1 as a constexpr: widen everything first
    n0, n, S, W = z + n0, z + n, z + S, z + W
    first = tl.maximum(n0, (W + S - 1) // S)
    c = tl.maximum(n - first, 0)
    return S * (c * (first + n - 1) // 2) - W * c


@triton.jit
def _chunk_tile(n0, nc, S, W, BLOCK: tl.constexpr):
    """Program (column tile, ``bh * nc + j``) of a group of segments: ``(pid, bh, j, P, cols)``
    with ``P`` the ranked prefix of segment ``n0 + j`` and ``cols`` the tile's key columns."""
    pid = tl.program_id(1)
    j = pid % nc
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    return pid, pid // nc, j, tl.maximum((n0 + j) * S - W, 0), cols


@triton.jit
def _s2o_place_kernel(
    IDX, OUT, n0, nc, N, width, p_max, S, W, head_keys, pos_bits,
    BLOCK: tl.constexpr, COMPACT: tl.constexpr,
):  # fmt: skip
    """Program (column tile, ``bh * nc + j``): row ``n0 + j`` of ``OUT`` ``[BH, N, p_max]`` gets
    the sorted positions of that row and ``-1`` past ``P``. ``IDX`` is ``[BH, nc, width]``, or with
    COMPACT the rows back to back (``head_keys`` per head, see :func:`_keys_before`) holding
    ``row << pos_bits | position``."""
    pid, bh, j, P, cols = _chunk_tile(n0, nc, S, W, BLOCK)
    if COMPACT:
        src_row = IDX + bh.to(tl.int64) * head_keys + _keys_before(n0, n0 + j, S, W)
    else:
        src_row = IDX + pid.to(tl.int64) * width
    src = tl.load(src_row + cols, mask=cols < P, other=-1)
    if COMPACT:
        src = tl.where(cols < P, src & ((1 << pos_bits) - 1), -1)
    dst = OUT + (bh.to(tl.int64) * N + n0 + j) * p_max + cols
    tl.store(dst, src.to(OUT.dtype.element_ty), mask=cols < p_max)


@triton.jit
def _s2o_cub_keys_kernel(
    SC, KEYS, VALS, stride_sbh, stride_sn, n0, nc, S, W, head_keys, pos_bits,
    BLOCK: tl.constexpr, SCORE_BITS: tl.constexpr,
):  # fmt: skip
    """Program (column tile, ``bh * nc + j``): for key ``c < P`` of row ``r = bh * nc + j`` the
    uint32 sort key (:func:`_sort_key`) and the value ``r << pos_bits | c``, back to back per row
    (COMPACT layout of the place kernel); both uint32 stored as int32."""
    pid, bh, j, P, cols = _chunk_tile(n0, nc, S, W, BLOCK)
    ok = cols < P
    score = tl.load(SC + bh.to(tl.int64) * stride_sbh + j * stride_sn + cols, mask=ok, other=0.0)
    dst = bh.to(tl.int64) * head_keys + _keys_before(n0, n0 + j, S, W) + cols
    row = pid.to(tl.int64)
    tl.store(KEYS + dst, _sort_key(score, row, SCORE_BITS).to(tl.int32), mask=ok)  # uint32
    tl.store(VALS + dst, ((row << pos_bits) | cols).to(tl.int32), mask=ok)


@triton.jit
def _sort_key(score, row, SCORE_BITS: tl.constexpr):
    """The uint32 (in an int64) that ranks ``score`` inside its ``row``: :func:`_desc_key`
    (ascending = descending score) or, with ``SCORE_BITS < 32``, ``row << SCORE_BITS |`` its top
    ``SCORE_BITS`` bits (scores that share them tie: ascending position decides)."""
    key = _desc_key(score)
    if SCORE_BITS < 32:
        key = (row << SCORE_BITS) | (key >> (32 - SCORE_BITS))
    return key


@triton.jit
def _desc_key(score):
    """fp32 -> int64 on ``[0, 2**32)``, ascending = descending score (``-0.0`` as ``+0.0``, NaN
    first, as ``torch.sort``)."""
    b = score.to(tl.int32, bitcast=True)
    asc = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # order-preserving map of fp32 bits onto int32
    asc = tl.where((b & 0x7FFFFFFF) == 0, 0, asc)
    asc = tl.where(score != score, 2147483647, asc)
    return 2147483647 - asc.to(tl.int64)


def _rank_chunk(
    s_k, kv_perm, prefix, a, segment_len, local_window, sort_mode, keys=None, masked=False,
    score_bits=32,
):  # fmt: skip
    """Rank chunk ``a..a+nc-1`` and write its rows of ``kv_perm`` (the placing kernel writes each
    row's ``-1`` padding in the same pass). ``s_k`` ``[B, Hq, nc, width]`` fp32 scores.

    ``torch.sort``: columns past a row's prefix must hold ``-inf`` (they sort after every real
    score and are cut off when placing); set here unless ``masked``. ``"cub"``: the valid keys of
    all rows, back to back, go through :func:`~s2o.kernels.cub_sort.rank_rows` (two stable
    device-wide radix sorts, one with ``score_bits < 32``); ``keys`` = ``(keys, vals)`` already
    packed, or None to pack them from ``s_k``."""
    B, Hq, nc, width = s_k.shape
    n_seg, p_max = kv_perm.shape[2], kv_perm.shape[3]
    block = 1024
    grid = (triton.cdiv(p_max, block), B * Hq * nc)
    geo = (a, nc, n_seg, width, p_max, segment_len, local_window)
    if sort_mode == "cub":
        head_keys = sum(prefix[a : a + nc])
        pos_bits, row_bits = _cub_bits(width, B * Hq * nc)
        if keys is None:
            keys = tuple(
                torch.empty(B * Hq * head_keys, dtype=torch.int32, device=s_k.device)
                for _ in range(2)
            )
            _s2o_cub_keys_kernel[(triton.cdiv(width, block), B * Hq * nc)](
                s_k, *keys, s_k.stride(1), s_k.stride(2), a, nc, segment_len, local_window,
                head_keys, pos_bits, BLOCK=block, SCORE_BITS=score_bits,
            )  # fmt: skip
        idx = rank_rows(*keys, pos_bits, row_bits, score_bits)
        _s2o_place_kernel[grid](idx, kv_perm, *geo, head_keys, pos_bits, BLOCK=block, COMPACT=True)
        return
    if not masked:
        for j in range(nc):
            if prefix[a + j] < width:
                s_k[:, :, j, prefix[a + j] :] = float("-inf")
    idx = torch.sort(s_k, dim=-1, descending=True, stable=True).indices
    _s2o_place_kernel[grid](idx, kv_perm, *geo, 0, 0, BLOCK=block, COMPACT=False)


def _cub_bits(width: int, rows: int) -> tuple[int, int]:
    return max(1, (width - 1).bit_length()), max(1, (rows - 1).bit_length())


def _sort_groups(
    prefix: list[int],
    rows_per_segment: int,
    mode: str,
    *,
    max_chunks: int | None = None,
    min_keys: int | None = None,
    score_bits: int = 32,
) -> list[tuple[int, int]]:
    """Contiguous groups of segments (non-empty prefix) whose keys one ``torch.sort`` call ranks.

    ``"chunks"``: ``_MAX_SORT_CHUNKS`` groups of similar width, one group below
    ``_MIN_GROUP_KEYS`` keys in all (one call per group; with >= 128 rows torch runs cub's
    segmented radix sort, one thread block per row). ``"cub"``: at most ``_MAX_SORT_CHUNKS``
    groups of at least ``_MIN_GROUP_KEYS`` keys, more where a group's ``row << pos_bits |
    position`` would not fit 32 bits (or, with ``score_bits < 32``, a row id beside the score).
    ``"full"``: groups of fewer than 128 rows, for which torch sorts the whole group with two
    device-wide radix sorts (keys, then row id), which streams at full bandwidth.
    ``max_chunks`` / ``min_keys`` replace ``_MAX_SORT_CHUNKS`` / ``_MIN_GROUP_KEYS`` (benchmarks).
    """
    max_chunks = _MAX_SORT_CHUNKS if max_chunks is None else max_chunks
    min_keys = _MIN_GROUP_KEYS if min_keys is None else min_keys
    first = next((n for n, p in enumerate(prefix) if p > 0), len(prefix))
    live = len(prefix) - first
    if live == 0:
        return []
    if mode == "full" and rows_per_segment < 128:
        per = max(1, 127 // rows_per_segment)
        bounds = list(range(first, len(prefix), per)) + [len(prefix)]
    else:
        keys = rows_per_segment * sum(prefix)
        if mode == "cub":
            n_chunks = max(1, min(max_chunks, live, keys // min_keys))
            # segments per group whose row ids fit next to the positions in 32 bits (none fit:
            # one segment per group, and rank_rows names the bit counts)
            fit = (1 << max(0, 32 - _cub_bits(prefix[-1], 1)[0])) // rows_per_segment
            if score_bits < 32:
                fit = min(fit, (1 << (32 - score_bits)) // rows_per_segment)
            n_chunks = min(live, max(n_chunks, -(-live // max(1, fit))))
        else:
            n_chunks = 1 if keys < min_keys else min(max_chunks, live)
        bounds = [first + (live * c) // n_chunks for c in range(n_chunks + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
