"""Step 1 of S2O (Alg. 1) on the GPU: segment means, query scores, causal-prefix key ranking.

Batched over batch, heads and segments: no per-head Python loop and no host synchronisation (every
shape follows from ``L``, ``S`` and ``W``). The only Python loop runs over a handful of *segment
chunks* so that the key sort works on ``[.., chunk, P_chunk]`` rectangles instead of one
``[.., N, P_max]`` rectangle that is half ``-inf`` padding.

Output layout (the same as the specification): ``q_perm`` ``[B, Hq, L]`` int64 absolute positions,
``kv_perm`` ``[B, Hq, N, P_max]`` int64 ranked prefix per segment padded with ``-1``.

Scores are fp32 dot products of fp32-upcast inputs (no tf32), so the order matches the reference up
to the summation order of the fp32 dot products; ties keep ascending token order (stable sort).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# at most this many key-sort rectangles; the padding waste is about 1 / (2 * chunks)
_MAX_SORT_CHUNKS = 8


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


def _sort_chunks(prefix: list[int]) -> list[tuple[int, int]]:
    """Split the segments with a non-empty prefix into contiguous chunks of similar width."""
    first = next((n for n, p in enumerate(prefix) if p > 0), len(prefix))
    live = len(prefix) - first
    if live == 0:
        return []
    n_chunks = min(_MAX_SORT_CHUNKS, live)
    bounds = [first + (live * c) // n_chunks for c in range(n_chunks + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def s2o_step1(
    q: torch.Tensor, k: torch.Tensor, *, segment_len: int, local_window: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 (Alg. 1): ``(q_perm [B, Hq, L] int64, kv_perm [B, Hq, N, P_max] int64)``.

    Args:
        q: ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``, ``Hq % Hkv == 0`` (GQA, K is never repeated:
            the ``G = Hq // Hkv`` query means of a key head are scored in one matrix product).
        segment_len: ``S``; local_window: ``W`` keys before each segment excluded from the ranking.
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

    k_guide = k[:, :, : min(S, L)].sum(dim=2, dtype=torch.float32) / min(S, L)  # [B, Hkv, D]
    q_perm = _query_perm(_query_scores(q, k_guide), S)

    kv_perm = torch.empty(B, Hq, n_seg, p_max, dtype=torch.long, device=q.device)
    if p_max == 0:
        return q_perm, kv_perm
    q_mean = _segment_means(q, S).view(B, Hkv, group, n_seg, D)
    kf = k[:, :, :p_max].float()  # [B, Hkv, P_max, D]; fp32 scores, never tf32
    prefix_t = torch.tensor(prefix, device=q.device)
    chunks = _sort_chunks(prefix)
    kv_perm[:, :, : chunks[0][0]] = -1  # segments with an empty prefix
    for a, b in chunks:
        width = prefix[b - 1]
        qm = q_mean[:, :, :, a:b].reshape(B, Hkv, group * (b - a), D)
        s_k = torch.matmul(qm, kf[:, :, :width].transpose(-1, -2)).view(B, Hq, b - a, width)
        cols = torch.arange(width, device=q.device)
        beyond = cols >= prefix_t[a:b, None]  # [chunk, width]
        s_k.masked_fill_(beyond, float("-inf"))
        idx = torch.sort(s_k, dim=-1, descending=True, stable=True).indices
        kv_perm[:, :, a:b, :width] = idx.masked_fill_(beyond, -1)
        kv_perm[:, :, a:b, width:] = -1
    return q_perm, kv_perm
