"""Step 1 of S2O (Alg. 1) on the GPU: segment means, query scores, causal-prefix key ranking.

Batched over batch, heads and segments: no per-head Python loop and no host synchronisation (every
shape follows from ``L``, ``S`` and ``W``). The only Python loop runs over *groups of segments*:
each group's keys are scored by one fp32 matrix product into a ``[B, Hq, group, P_last]``
rectangle and ranked by one ``torch.sort`` call (see :func:`_sort_groups` for how the group size
picks torch's sort algorithm).

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

# at most this many key-sort rectangles in sort_mode "chunks"; padding waste ~ 1 / (2 * chunks)
_MAX_SORT_CHUNKS = 8
# defaults of s2o_step1 (benchmarks compare the alternatives; on an H200 at 128K "full" was slower,
# 17.9 vs 15.4 ms, and int32 saved nothing measurable: the sort dominates)
STEP1_CONFIG = {"index_dtype": torch.int64, "sort_mode": "chunks"}


@triton.jit
def _s2o_qscore_kernel(
    Q, G, OUT, stride_qb, stride_qh, stride_ql, L, H, GROUP,
    BLOCK: tl.constexpr, HEAD_D: tl.constexpr,
):  # fmt: skip
    """``OUT[b, h, l] = <q[b, h, l], g[b, h // GROUP]>`` in fp32 (bf16/fp16 read once, no copy)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_D)
    ok = rows < L
    q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_ql
    q = tl.load(q_ptrs + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    g = tl.load(G + (b * (H // GROUP) + h // GROUP) * HEAD_D + offs_d)
    tl.store(OUT + bh * L + rows, tl.sum(q * g[None, :], axis=1), mask=ok)


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


def _query_scores(q: torch.Tensor, k_guide: torch.Tensor) -> torch.Tensor:
    """``[B, Hq, L]`` fp32 ``<q, k_guide>`` with ``k_guide`` ``[B, Hkv, D]`` fp32."""
    B, Hq, L, D = q.shape
    if q.stride(-1) != 1 or D & (D - 1):
        kg = k_guide.repeat_interleave(Hq // k_guide.shape[1], dim=1)
        return torch.einsum("bhld,bhd->bhl", q.float(), kg)
    out = torch.empty(B, Hq, L, dtype=torch.float32, device=q.device)
    block = 64
    grid = (triton.cdiv(L, block), B * Hq)
    _s2o_qscore_kernel[grid](
        q, k_guide.contiguous(), out, q.stride(0), q.stride(1), q.stride(2), L, Hq,
        Hq // k_guide.shape[1], BLOCK=block, HEAD_D=D,
    )  # fmt: skip
    return out


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
        sort_mode: ``"full"`` or ``"chunks"`` (see :func:`_sort_groups`); default from the config.
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
    index_dtype = STEP1_CONFIG["index_dtype"] if index_dtype is None else index_dtype
    sort_mode = STEP1_CONFIG["sort_mode"] if sort_mode is None else sort_mode

    k_guide = k[:, :, : min(S, L)].sum(dim=2, dtype=torch.float32) / min(S, L)  # [B, Hkv, D]
    q_perm = _query_perm(_query_scores(q, k_guide), S)

    kv_perm = torch.empty(B, Hq, n_seg, p_max, dtype=index_dtype, device=q.device)
    if p_max == 0:
        return q_perm, kv_perm
    q_mean = _segment_means(q, S).view(B, Hkv, group, n_seg, D)
    kf = k[:, :, :p_max].float()  # [B, Hkv, P_max, D]; fp32 scores, never tf32
    groups = _sort_groups(prefix, B * Hq, sort_mode)
    kv_perm[:, :, : groups[0][0]] = -1  # segments with an empty prefix
    for a, b in groups:
        width = prefix[b - 1]
        qm = q_mean[:, :, :, a:b].reshape(B, Hkv, group * (b - a), D)
        s_k = torch.matmul(qm, kf[:, :, :width].transpose(-1, -2)).view(B, Hq, b - a, width)
        if b - a > 1:  # shorter prefixes in the group: -inf sorts after every real score
            cols = torch.arange(width, device=q.device)
            beyond = cols >= torch.tensor(prefix[a:b], device=q.device)[:, None]
            s_k.masked_fill_(beyond, float("-inf"))
        kv_perm[:, :, a:b, :width] = torch.sort(s_k, dim=-1, descending=True, stable=True).indices
        for n in range(a, b):  # padding: -1 past the prefix
            kv_perm[:, :, n, prefix[n] :] = -1
    return q_perm, kv_perm
