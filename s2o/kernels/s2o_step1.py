"""Step 1 of S2O (Alg. 1) on the GPU: segment means, query scores, causal-prefix key ranking.

Batched over batch, heads and segments: no per-head Python loop and no host synchronisation (every
shape follows from ``L``, ``S`` and ``W``). The only Python loop runs over *groups of segments*:
each group's keys are scored by one fp32 matrix product into a ``[B, Hq, group, P_last]``
rectangle and ranked by one ``torch.sort`` call (see :func:`_sort_groups` for how the group size
picks torch's sort algorithm) or, with ``sort_mode="cub"``, by two CUB radix sorts over packed
keys (:mod:`s2o.kernels.cub_sort`; opt-in, it compiles a CUDA extension). Around the sort,
Triton kernels read the queries once (segment means and query scores together) and write each
sorted group into ``kv_perm`` with its ``-1`` padding in one pass.

Output layout (the specification's): ``q_perm`` ``[B, Hq, L]`` int64 absolute positions,
``kv_perm`` ``[B, Hq, N, P_max]`` ranked prefix per segment padded with ``-1``, int64 or int32
(``index_dtype``; the kernels read either, the reference needs int64).

Scores are fp32 dot products of fp32-upcast inputs (no tf32), so the order matches the reference up
to the summation order of the fp32 dot products; ties keep ascending token order (stable sort).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cub_sort import rank_rows

# at most this many key-sort rectangles in sort_mode "chunks"; padding waste ~ 1 / (2 * chunks)
_MAX_SORT_CHUNKS = 8
# defaults of s2o_step1; set_step1_config changes them (benchmarks/step1_probe.py compares all;
# H200, 128K, S=2048: chunks 14.2 ms, full 16.3, cub 9.25, cub with int32 kv_perm 8.99). "cub" is
# not the default because it compiles a CUDA extension on first use (needs nvcc).
STEP1_CONFIG = {"index_dtype": torch.int64, "sort_mode": "chunks"}
_SORT_MODES = ("chunks", "full", "cub")


def _check_step1_options(sort_mode: str | None, index_dtype: torch.dtype | None) -> None:
    if sort_mode is not None and sort_mode not in _SORT_MODES:
        raise ValueError(f"sort_mode must be one of {_SORT_MODES}, got {sort_mode!r}")
    if index_dtype is not None and index_dtype not in (torch.int64, torch.int32):
        raise ValueError(f"index_dtype must be torch.int64 or torch.int32, got {index_dtype}")


def set_step1_config(*, sort_mode: str | None = None, index_dtype: torch.dtype | None = None):
    """Defaults of :func:`s2o_step1` for every later call (the API and the harness included):
    ``sort_mode`` ``"chunks"``, ``"full"`` or ``"cub"``; ``index_dtype`` int64 or int32."""
    _check_step1_options(sort_mode, index_dtype)
    if sort_mode is not None:
        STEP1_CONFIG["sort_mode"] = sort_mode
    if index_dtype is not None:
        STEP1_CONFIG["index_dtype"] = index_dtype


@triton.jit
def _s2o_qstats_kernel(
    Q, G, QMEAN, SQ, stride_qb, stride_qh, stride_ql, L, H, GROUP, S, N,
    BLOCK: tl.constexpr, HEAD_D: tl.constexpr,
):  # fmt: skip
    """Program (segment ``n``, ``b * H + h``), one read of the segment's queries:
    ``QMEAN[b, h, n] = mean(q)`` and ``SQ[b, h, l] = <q[l], g[b, h // GROUP]>``, both fp32."""
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_d = tl.arange(0, HEAD_D)
    g = tl.load(G + (b * (H // GROUP) + h // GROUP) * HEAD_D + offs_d)
    start = n * S
    end = tl.minimum(start + S, L)
    base = Q + b * stride_qb + h * stride_qh
    acc = tl.zeros([HEAD_D], dtype=tl.float32)
    for r0 in range(start, end, BLOCK):
        rows = r0 + tl.arange(0, BLOCK)
        ok = rows < end
        x = tl.load(base + rows[:, None].to(tl.int64) * stride_ql + offs_d[None, :],
                    mask=ok[:, None], other=0.0).to(tl.float32)  # fmt: skip
        acc += tl.sum(x, axis=0)
        tl.store(SQ + bh * L + rows, tl.sum(x * g[None, :], axis=1), mask=ok)
    tl.store(QMEAN + (bh * N + n) * HEAD_D + offs_d, acc / (end - start))


@triton.jit
def _chunk_row_start(n0, j, S, W):
    """Keys of the chunk's segments ``n0 .. n0 + j - 1`` (one head): ``sum max(0, n*S - W)``."""
    acc = tl.full([], 0, tl.int64)  # not derived from n0: Triton passes an int 1 as a constexpr
    for i in range(0, j):
        acc += tl.maximum((n0 + i) * S - W, 0).to(tl.int64)
    return acc


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
    COMPACT the rows back to back (``head_keys`` per head, see :func:`_chunk_row_start`) holding
    ``row << pos_bits | position``."""
    pid, bh, j, P, cols = _chunk_tile(n0, nc, S, W, BLOCK)
    if COMPACT:
        src_row = IDX + bh.to(tl.int64) * head_keys + _chunk_row_start(n0, j, S, W)
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
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Program (column tile, ``bh * nc + j``): for key ``c < P`` of row ``r = bh * nc + j`` the
    uint32 ``u`` (ascending = fp32 score descending, ``-0.0`` as ``+0.0``, NaN first) and the value
    ``r << pos_bits | c``, back to back per row (COMPACT layout of the place kernel); both uint32
    stored as int32."""
    pid, bh, j, P, cols = _chunk_tile(n0, nc, S, W, BLOCK)
    ok = cols < P
    score = tl.load(SC + bh.to(tl.int64) * stride_sbh + j * stride_sn + cols, mask=ok, other=0.0)
    b = score.to(tl.int32, bitcast=True)
    asc = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # order-preserving map of fp32 bits onto int32
    asc = tl.where((b & 0x7FFFFFFF) == 0, 0, asc)
    asc = tl.where(score != score, 2147483647, asc)
    u = 2147483647 - asc.to(tl.int64)  # descending, on [0, 2**32)
    dst = bh.to(tl.int64) * head_keys + _chunk_row_start(n0, j, S, W) + cols
    tl.store(KEYS + dst, u.to(tl.int32), mask=ok)  # the low 32 bits: uint32 as int32
    tl.store(VALS + dst, ((pid.to(tl.int64) << pos_bits) | cols).to(tl.int32), mask=ok)


def _segment_means(x: torch.Tensor, segment_len: int) -> torch.Tensor:
    """``[B, H, L, D]`` -> ``[B, H, N, D]`` fp32 means over each segment (last may be shorter)."""
    B, H, L, D = x.shape
    full = L // segment_len
    parts = []
    if full:
        body = x[:, :, : full * segment_len].reshape(B, H, full, segment_len, D)
        parts.append(body.sum(dim=3, dtype=torch.float32) / segment_len)
    if L % segment_len:
        tail = x[:, :, full * segment_len :]
        parts.append(tail.sum(dim=2, keepdim=True, dtype=torch.float32) / tail.shape[2])
    return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]


def _query_stats(q: torch.Tensor, k_guide: torch.Tensor, segment_len: int):
    """``(q_mean [B, Hq, N, D], s_q [B, Hq, L])`` fp32: segment means and ``<q, k_guide>``
    (``k_guide`` ``[B, Hkv, D]`` fp32), from one read of ``q`` when its rows are contiguous."""
    B, Hq, L, D = q.shape
    n_seg = triton.cdiv(L, segment_len)
    if q.stride(-1) != 1 or D & (D - 1):
        kg = k_guide.repeat_interleave(Hq // k_guide.shape[1], dim=1)
        return _segment_means(q, segment_len), torch.einsum("bhld,bhd->bhl", q.float(), kg)
    q_mean = torch.empty(B, Hq, n_seg, D, dtype=torch.float32, device=q.device)
    s_q = torch.empty(B, Hq, L, dtype=torch.float32, device=q.device)
    _s2o_qstats_kernel[(n_seg, B * Hq)](
        q, k_guide.contiguous(), q_mean, s_q, q.stride(0), q.stride(1), q.stride(2), L, Hq,
        Hq // k_guide.shape[1], segment_len, n_seg, BLOCK=64, HEAD_D=D,
    )  # fmt: skip
    return q_mean, s_q


def _rank_chunk(s_k, kv_perm, prefix, a, segment_len, local_window, sort_mode):
    """Sort chunk ``a..a+nc-1``'s scores ``[B, Hq, nc, width]`` and write its rows of ``kv_perm``
    (the placing kernel writes each row's ``-1`` padding in the same pass).

    ``torch.sort``: columns past a row's prefix are set to ``-inf`` first (they sort after every
    real score and are cut off when placing). ``"cub"``: the valid keys of all rows, back to back,
    go through :func:`~s2o.kernels.cub_sort.rank_rows` (two stable device-wide radix sorts)."""
    B, Hq, nc, width = s_k.shape
    n_seg, p_max = kv_perm.shape[2], kv_perm.shape[3]
    block = 1024
    grid = (triton.cdiv(p_max, block), B * Hq * nc)
    geo = (a, nc, n_seg, width, p_max, segment_len, local_window)
    if sort_mode == "cub":
        head_keys = sum(prefix[a : a + nc])
        pos_bits, row_bits = (
            max(1, (width - 1).bit_length()),
            max(1, (B * Hq * nc - 1).bit_length()),
        )
        keys = torch.empty(B * Hq * head_keys, dtype=torch.int32, device=s_k.device)
        vals = torch.empty(B * Hq * head_keys, dtype=torch.int32, device=s_k.device)
        _s2o_cub_keys_kernel[(triton.cdiv(width, block), B * Hq * nc)](
            s_k, keys, vals, s_k.stride(1), s_k.stride(2), a, nc, segment_len, local_window,
            head_keys, pos_bits, BLOCK=block,
        )  # fmt: skip
        idx = rank_rows(keys, vals, pos_bits, row_bits)
        _s2o_place_kernel[grid](idx, kv_perm, *geo, head_keys, pos_bits, BLOCK=block, COMPACT=True)
        return
    for j in range(nc):
        if prefix[a + j] < width:
            s_k[:, :, j, prefix[a + j] :] = float("-inf")
    idx = torch.sort(s_k, dim=-1, descending=True, stable=True).indices
    _s2o_place_kernel[grid](idx, kv_perm, *geo, 0, 0, BLOCK=block, COMPACT=False)


def _query_perm(s_q: torch.Tensor, segment_len: int) -> torch.Tensor:
    """Sort ``s_q`` ``[B, Hq, L]`` inside each segment; returns absolute positions int64."""
    B, Hq, L = s_q.shape
    n_seg = triton.cdiv(L, segment_len)
    pad = n_seg * segment_len - L
    if pad:  # -inf pads sort after every real score and are cut off below
        s_q = torch.nn.functional.pad(s_q, (0, pad), value=float("-inf"))
    order = torch.sort(
        s_q.view(B, Hq, n_seg, segment_len), dim=-1, descending=True, stable=True
    ).indices
    base = torch.arange(n_seg, device=s_q.device, dtype=torch.long)[:, None] * segment_len
    return (order + base).view(B, Hq, n_seg * segment_len)[..., :L]


def _sort_groups(prefix: list[int], rows_per_segment: int, mode: str) -> list[tuple[int, int]]:
    """Contiguous groups of segments (non-empty prefix) whose keys one ``torch.sort`` call ranks.

    ``"chunks"``: at most ``_MAX_SORT_CHUNKS`` groups of similar width (one call per group; with
    >= 128 rows torch runs cub's segmented radix sort, one thread block per row).
    ``"full"``: groups of fewer than 128 rows, for which torch sorts the whole group with two
    device-wide radix sorts (keys, then row id), which streams at full bandwidth.
    """
    first = next((n for n, p in enumerate(prefix) if p > 0), len(prefix))
    live = len(prefix) - first
    if live == 0:
        return []
    if mode == "full" and rows_per_segment < 128:
        per = max(1, 127 // rows_per_segment)
        bounds = list(range(first, len(prefix), per)) + [len(prefix)]
    else:
        n_chunks = min(_MAX_SORT_CHUNKS, live)
        bounds = [first + (live * c) // n_chunks for c in range(n_chunks + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def s2o_step1(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    segment_len: int,
    local_window: int = 0,
    index_dtype: torch.dtype | None = None,
    sort_mode: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 (Alg. 1): ``(q_perm [B, Hq, L] int64, kv_perm [B, Hq, N, P_max])``.

    Args:
        q: ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``, ``Hq % Hkv == 0`` (GQA, K is never repeated:
            the ``G = Hq // Hkv`` query means of a key head are scored in one matrix product).
        segment_len: ``S``; local_window: ``W`` keys before each segment excluded from the ranking.
        index_dtype: dtype of ``kv_perm`` (default ``STEP1_CONFIG["index_dtype"]``): int64 is the
            specification's, int32 halves the bytes (the kernels take either; the values are equal).
        sort_mode: ``"chunks"`` or ``"full"`` (``torch.sort``, see :func:`_sort_groups`) or
            ``"cub"`` (two CUB radix sorts per group, :mod:`s2o.kernels.cub_sort`; compiles a CUDA
            extension on first use); default from the config (:func:`set_step1_config`).
    Returns:
        q_perm: absolute query positions, descending ``<q, mean(k[:, :, :S])>`` inside each segment.
        kv_perm: row ``n`` = keys ``0..P_n-1`` (``P_n = max(0, n*S - W)``) in descending
            ``<mean(q_segment_n), k>`` order, padded with ``-1``.
    """
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    S = segment_len
    n_seg = triton.cdiv(L, S)
    prefix = [max(0, n * S - local_window) for n in range(n_seg)]
    p_max = prefix[-1]
    _check_step1_options(sort_mode, index_dtype)  # before any early return: also for L < S
    index_dtype = STEP1_CONFIG["index_dtype"] if index_dtype is None else index_dtype
    sort_mode = STEP1_CONFIG["sort_mode"] if sort_mode is None else sort_mode

    k_guide = k[:, :, : min(S, L)].sum(dim=2, dtype=torch.float32) / min(S, L)  # [B, Hkv, D]
    q_mean, s_q = _query_stats(q, k_guide, S)
    q_perm = _query_perm(s_q, S)

    kv_perm = torch.empty(B, Hq, n_seg, p_max, dtype=index_dtype, device=q.device)
    if p_max == 0:
        return q_perm, kv_perm
    q_mean = q_mean.view(B, Hkv, group, n_seg, D)
    # fp32 scores, never tf32; converting all of a contiguous k and slicing after is a vectorized
    # copy (a strided slice first was 2x slower on an H200)
    kf = (k.float() if k.is_contiguous() else k[:, :, :p_max].float())[:, :, :p_max]
    groups = _sort_groups(prefix, B * Hq, sort_mode)
    kv_perm[:, :, : groups[0][0]] = -1  # segments with an empty prefix
    for a, b in groups:
        width = prefix[b - 1]
        qm = q_mean[:, :, :, a:b].reshape(B, Hkv, group * (b - a), D)
        s_k = torch.matmul(qm, kf[:, :, :width].transpose(-1, -2)).view(B, Hq, b - a, width)
        _rank_chunk(s_k, kv_perm, prefix, a, S, local_window, sort_mode)
    return q_perm, kv_perm
