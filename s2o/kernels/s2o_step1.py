"""Step 1 of S2O (Alg. 1) on the GPU: segment means, query scores, causal-prefix key ranking.

Batched over batch, heads and segments: no per-head Python loop and no host synchronisation (every
shape follows from ``L``, ``S`` and ``W``). The only Python loop runs over *groups of segments*:
each group's keys are scored into a ``[B, Hq, group, P_last]`` rectangle and ranked by one
``torch.sort`` call or, with ``sort_mode="cub"``, scored straight into packed keys and ranked by
two CUB radix sorts (:mod:`s2o.kernels.cub_sort`; opt-in, it compiles a CUDA extension). The
sort policy (which segments form a group), the key packing and the kernel that places each
sorted group into ``kv_perm`` with its ``-1`` padding live in :mod:`s2o.kernels.step1_sort`; this
file scores: a Triton kernel reads the queries once (segment means and query scores together),
another scores the keys.

Key scores: for bf16 K on CUDA, :func:`_s2o_key_scores_kernel` reads K once in bf16 and takes the
segment means as three bf16 terms that add up to the fp32 mean exactly (:func:`split_bf16`), so
the MMA sums exact fp32 products; otherwise an fp32 copy of K and an fp32 matrix product.

Output layout (the specification's): ``q_perm`` ``[B, Hq, L]`` int64 absolute positions,
``kv_perm`` ``[B, Hq, N, P_max]`` ranked prefix per segment padded with ``-1``, int64 or int32
(``index_dtype``; the kernels read either, the reference needs int64).

Scores are fp32 dot products (no tf32), so the order matches the reference up to the summation
order of the fp32 dot products (near-ties can swap: on the 128K benchmark input 0.9% of the
``kv_perm`` entries differ between the two score paths); ties keep ascending token order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dense_tail import tail_last, tail_start
from ..reference import SCORE_BITS
from ..tail_rank import tail_rows
from .step1_sort import (
    _SORT_MODES,
    INDEX_DTYPE,
    SORT_MODE,
    _cub_bits,
    _keys_before,
    _rank_chunk,
    _sort_groups,
    _sort_key,
)


def _check_step1_options(
    sort_mode: str | None, index_dtype: torch.dtype | None, score_bits: int = 32, causal=True,
    tail_rank: int = 0,
) -> None:  # fmt: skip
    if sort_mode is not None and sort_mode not in _SORT_MODES:
        raise ValueError(f"sort_mode must be one of {_SORT_MODES}, got {sort_mode!r}")
    if score_bits not in SCORE_BITS:
        raise ValueError(f"score_bits must be one of {SCORE_BITS}, got {score_bits!r}")
    if score_bits < 32 and (sort_mode != "cub" or not causal or tail_rank):
        raise ValueError(
            f"score_bits={score_bits} ranks with one CUB sort: it needs sort_mode='cub' (got "
            f"{sort_mode!r}), causal=True (got {causal}) and no tail_rank (got {tail_rank})"
        )
    if index_dtype is not None and index_dtype not in (torch.int64, torch.int32):
        raise ValueError(f"index_dtype must be torch.int64 or torch.int32, got {index_dtype}")


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
def _s2o_key_scores_kernel(
    QX, K, OUT, KEYS, VALS,
    stride_kb, stride_kh, stride_kl, stride_ob, stride_oh, stride_on,
    Hkv, GROUP, n0, nc, n_seg, S, W, rows, n_rb, width, head_keys, pos_bits,
    NPARTS: tl.constexpr, RB: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
    KEYS_OUT: tl.constexpr, IEEE: tl.constexpr, SCORE_BITS: tl.constexpr,
):  # fmt: skip
    """Program (key tile, ``(b * Hkv + hk) * n_rb + row block``): scores of ``RB`` rows
    ``r = g * nc + j`` (query head ``hk * GROUP + g``, segment ``n0 + j``) of one group against
    ``BLOCK_N`` keys read once from K in its own dtype. ``QX`` ``[B*Hkv, NPARTS, GROUP*n_seg, D]``
    holds the segment means of all segments as NPARTS terms (bf16 ``hi, mid, lo`` or one fp32
    term), summed in fp32 by the MMA, smallest first. Columns at or past the row's prefix
    ``P = max(0, (n0 + j) * S - W)`` are not keys; among the group's keys of a head, the row's
    start after :func:`_keys_before` ``(n0, n0 + j)``. KEYS_OUT: the packed sort keys and values
    in the layout of :func:`~s2o.kernels.step1_sort._s2o_cub_keys_kernel`; otherwise the fp32
    rectangle ``OUT`` ``[B, Hq, nc, width]`` with ``-inf`` past the prefix."""
    pid_kv = tl.program_id(1) // n_rb
    rb = tl.program_id(1) % n_rb
    b = (pid_kv // Hkv).to(tl.int64)
    hk = pid_kv % Hkv
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    kt = tl.load(K + b * stride_kb + hk * stride_kh + cols[:, None].to(tl.int64) * stride_kl
                 + offs_d[None, :], mask=(cols < width)[:, None], other=0.0)  # fmt: skip
    r = rb * RB + tl.arange(0, RB)
    g = r // nc
    j = r % nc
    row_ok = r < rows
    part = GROUP * n_seg * HEAD_D  # elements per term
    q_rows = (QX + pid_kv.to(tl.int64) * NPARTS * part
              + ((g * n_seg + n0 + j) * HEAD_D)[:, None] + offs_d[None, :])  # fmt: skip
    acc = tl.zeros([RB, BLOCK_N], dtype=tl.float32)
    for t in tl.static_range(NPARTS):
        qp = tl.load(q_rows + (NPARTS - 1 - t) * part, mask=row_ok[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(qp, tl.trans(kt), acc, input_precision="ieee")
        else:
            acc = tl.dot(qp, tl.trans(kt), acc)
    P = tl.maximum((n0 + j).to(tl.int64) * S - W, 0)
    key = row_ok[:, None] & (cols[None, :] < P[:, None])
    bh = b * (Hkv * GROUP) + hk * GROUP + g  # [RB]
    if KEYS_OUT:
        dst = (bh * head_keys + _keys_before(n0, n0 + j, S, W))[:, None] + cols[None, :]
        row = (bh * nc + j).to(tl.int64)[:, None]
        tl.store(KEYS + dst, _sort_key(acc, row, SCORE_BITS).to(tl.int32), mask=key)
        val = (row << pos_bits) | cols[None, :]
        tl.store(VALS + dst, val.to(tl.int32), mask=key)
    else:
        o = (
            OUT
            + (b * stride_ob + (hk * GROUP + g) * stride_oh + j * stride_on)[:, None]
            + cols[None, :]
        )
        tl.store(
            o, tl.where(key, acc, float("-inf")), mask=row_ok[:, None] & (cols < width)[None, :]
        )


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


def split_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` ``[..., R, D]`` -> bf16 ``[..., 3, R, D]``: ``hi, mid, lo`` with ``hi + mid + lo
    == x`` (three 8-bit significands carry fp32's 24; bf16 has fp32's exponent range). Exact for
    ``2**-109 <= |x| <=`` bf16's largest value; below, the lower terms lose bits to subnormals (an
    absolute error under ``2**-126``)."""
    hi = x.to(torch.bfloat16)
    rest = x - hi.float()
    mid = rest.to(torch.bfloat16)
    lo = (rest - mid.float()).to(torch.bfloat16)
    return torch.stack([hi, mid, lo], dim=-3)


def _score_operands(q_mean: torch.Tensor, k: torch.Tensor):
    """The key-score kernel's operands, once for every group: ``(qx, kx)``. ``qx``
    ``[B*Hkv, NPARTS, group*N, D]``: for bf16 K on CUDA the segment means as three exact bf16
    terms (:func:`split_bf16`) against K itself, so the MMA sums exact fp32 products while K is
    read once, in bf16; otherwise one fp32 term against an fp32 copy of K."""
    B, Hkv, group, n_seg, D = q_mean.shape
    qm = q_mean.reshape(B * Hkv, group * n_seg, D)
    if k.dtype == torch.bfloat16 and k.is_cuda:
        return split_bf16(qm), k
    return qm[:, None].contiguous(), k.float()


def _fused_group(qx, kx, shape, prefix, a, b, sort_mode, segment_len, local_window,
                 score_bits=32):  # fmt: skip
    """Scores of segments ``a..b-1`` from :func:`_s2o_key_scores_kernel`: ``(s_k, keys)`` as
    :func:`_rank_chunk` takes them (the rectangle for ``torch.sort``, the packed keys for cub).
    Host work per group is this launch and the outputs' allocation: with many short groups (short
    L, small S) Step 1 is bound by the host."""
    B, Hkv, group, n_seg = shape
    Hq, nc, width = Hkv * group, b - a, prefix[b - 1]
    rows = group * nc
    rb = min(64, max(16, triton.next_power_of_2(rows)))
    n_rb = triton.cdiv(rows, rb)
    dev = kx.device
    head_keys = sum(prefix[a:b])
    if sort_mode == "cub":
        s_k = torch.empty(1, device=dev).expand(B, Hq, nc, width)  # its shape only
        keys = tuple(torch.empty(B * Hq * head_keys, dtype=torch.int32, device=dev) for _ in "kv")
        out, pos_bits = keys[0], _cub_bits(width, B * Hq * nc)[0]
    else:
        s_k = torch.empty(B, Hq, nc, width, dtype=torch.float32, device=dev)
        keys, out, pos_bits = None, s_k, 0
    block_n = 128
    _s2o_key_scores_kernel[(triton.cdiv(width, block_n), B * Hkv * n_rb)](
        qx, kx, out, *(keys or (out, out)),
        kx.stride(0), kx.stride(1), kx.stride(2), *((0, 0, 0) if keys else s_k.stride()[:3]),
        Hkv, group, a, nc, n_seg, segment_len, local_window, rows, n_rb, width, head_keys, pos_bits,
        NPARTS=qx.shape[1], RB=rb, BLOCK_N=block_n, HEAD_D=qx.shape[-1],
        KEYS_OUT=keys is not None, IEEE=qx.dtype == torch.float32, SCORE_BITS=score_bits,
        num_warps=4,
    )  # fmt: skip
    return s_k, keys


def _rank_outside_segments(
    q_mean: torch.Tensor, k: torch.Tensor, segment_len: int, local_window: int, index_dtype
) -> torch.Tensor:
    """Non-causal ``kv_perm`` ``[B, Hq, N, P_max]``: row ``n`` ranks the keys outside
    ``[max(0, n*S - W), e_n)`` by descending fp32 ``<q_mean[n], k>`` (stable), padded with ``-1``.
    ``q_mean`` ``[B, Hq, N, D]`` fp32."""
    B, Hq, n_seg, D = q_mean.shape
    Hkv, L = k.shape[1], k.shape[2]
    dev = k.device
    qm = q_mean.reshape(B, Hkv, (Hq // Hkv) * n_seg, D)
    s_k = torch.matmul(qm, k.float().transpose(-1, -2)).view(B, Hq, n_seg, L)
    starts = torch.arange(n_seg, device=dev) * segment_len
    lo = (starts - local_window).clamp(min=0)
    end = (starts + segment_len).clamp(max=L)
    pos = torch.arange(L, device=dev)
    inside = (pos[None, :] >= lo[:, None]) & (pos[None, :] < end[:, None])  # [N, L]
    s_k.masked_fill_(inside, float("-inf"))
    count = L - (end - lo)
    p_max = int(count.max())
    order = torch.sort(s_k, dim=-1, descending=True, stable=True).indices[..., :p_max]
    order.masked_fill_(torch.arange(p_max, device=dev) >= count[:, None], -1)
    return order.to(index_dtype)


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


def _rank_tail(q, k, segment_len: int, local_window: int, tail_rank: int,
               p_max: int) -> torch.Tensor:  # fmt: skip
    """``tail_rank``'s rows of ``kv_perm`` ``[B, Hq, N_tail, p_max]`` int64: segment ``n``'s ranked
    prefix in descending fp32 ``<mean of its tail rows' queries, k>`` order (stable), ``-1``
    padded. GQA without repeating K: the ``G * N_tail`` means of a key head in one product."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    start = tail_start(L, tail_rank)
    n0, n_tail = tail_rows(L, segment_len, tail_rank)
    means = [q[:, :, max(n * segment_len, start) : min((n + 1) * segment_len, L)]
             for n in range(n0, n0 + n_tail)]  # fmt: skip
    q_tail = torch.stack([x.sum(dim=2, dtype=torch.float32) / x.shape[2] for x in means], dim=2)
    qm = q_tail.view(B, Hkv, (Hq // Hkv) * n_tail, D)
    s_k = torch.matmul(qm, k[:, :, :p_max].float().transpose(-1, -2)).view(B, Hq, n_tail, p_max)
    prefix = torch.tensor([max(0, n * segment_len - local_window) for n in range(n0, n0 + n_tail)],
                          device=q.device)  # fmt: skip
    cols = torch.arange(p_max, device=q.device)
    s_k.masked_fill_(cols >= prefix[:, None], float("-inf"))
    order = torch.sort(s_k, dim=-1, descending=True, stable=True).indices
    return order.masked_fill_(cols >= prefix[:, None], -1)


def s2o_step1(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    segment_len: int,
    local_window: int = 0,
    index_dtype: torch.dtype | None = None,
    sort_mode: str | None = None,
    causal: bool = True,
    fused_scores: bool | None = None,
    tail_rank: int = 0,
    score_bits: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 (Alg. 1): ``(q_perm [B, Hq, L] int64, kv_perm [B, Hq, N, P_max])``.

    Args:
        q: ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``, ``Hq % Hkv == 0`` (GQA, K is never repeated:
            the ``G = Hq // Hkv`` query means of a key head are scored in one matrix product).
        segment_len: ``S``; local_window: ``W`` keys before each segment excluded from the ranking.
        index_dtype: dtype of ``kv_perm`` (default :data:`INDEX_DTYPE`, int64, the
            specification's); int32 halves the bytes (the kernels take either; the values are
            equal).
        sort_mode: ``"chunks"`` or ``"full"`` (``torch.sort``, see :func:`_sort_groups`) or
            ``"cub"`` (two CUB radix sorts per group, :mod:`s2o.kernels.cub_sort`; compiles a CUDA
            extension on first use); default :data:`SORT_MODE`.
        causal: False ranks every key outside the window and the own segment (one fp32 product
            and one ``torch.sort`` over all ``L`` keys per segment; ``sort_mode`` is not used).
        fused_scores: score the keys with :func:`_s2o_key_scores_kernel` (None: for bf16 K on
            CUDA; True forces it, with fp32 operands off CUDA; False: an fp32 copy of K and fp32
            GEMMs).
        tail_rank: a named variant (:mod:`s2o.tail_rank`; 0: off, the paper's Step 1): the last
            ``tail_rank`` rows go last in their segments' ``q_perm`` and ``kv_perm`` gets one row
            per segment holding them, ranked by their own mean query (:func:`_rank_tail`);
            causal only.
        score_bits: 32 ranks the fp32 scores (the specification); 16 or 24 (a named variant,
            ``sort_mode="cub"`` and causal only) ranks by the top bits of each score's
            order-preserving uint32 image, ties in ascending position
            (:func:`s2o.reference.score_buckets`), so one CUB sort of ``row << score_bits |``
            those bits ranks every row of a group.
    Returns:
        q_perm: absolute query positions, descending ``<q, mean(k[:, :, :S])>`` inside each segment.
        kv_perm: row ``n`` = keys ``0..P_n-1`` (``P_n = max(0, n*S - W)``) in descending
            ``<mean(q_segment_n), k>`` order, padded with ``-1``; non-causal: the ``P_n = L -
            (e_n - max(0, n*S - W))`` keys outside ``[n*S - W, e_n)`` (``e_n`` the segment's end).
            With ``tail_rank``, the tail's rows follow (:func:`s2o.tail_rank.tail_rows`).
    """
    index_dtype = INDEX_DTYPE if index_dtype is None else index_dtype
    sort_mode = SORT_MODE if sort_mode is None else sort_mode
    # before any work or early return (also for L < S)
    _check_step1_options(sort_mode, index_dtype, score_bits, causal, tail_rank)
    if tail_rank:
        if not causal:
            raise ValueError(f"tail_rank={tail_rank} ranks a causal prefix: causal must be True")
        q_perm, kv_perm = s2o_step1(
            q, k, segment_len=segment_len, local_window=local_window, index_dtype=index_dtype,
            sort_mode=sort_mode, fused_scores=fused_scores,
        )  # fmt: skip
        tail = _rank_tail(q, k, segment_len, local_window, tail_rank, kv_perm.shape[-1])
        kv_perm = torch.cat([kv_perm, tail.to(kv_perm.dtype)], dim=2)
        return tail_last(q_perm, segment_len, tail_rank), kv_perm
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    S = segment_len
    n_seg = triton.cdiv(L, S)
    prefix = [max(0, n * S - local_window) for n in range(n_seg)]
    p_max = prefix[-1]

    k_guide = k[:, :, : min(S, L)].sum(dim=2, dtype=torch.float32) / min(S, L)  # [B, Hkv, D]
    q_mean, s_q = _query_stats(q, k_guide, S)
    q_perm = _query_perm(s_q, S)

    if not causal:
        return q_perm, _rank_outside_segments(q_mean, k, S, local_window, index_dtype)
    kv_perm = torch.empty(B, Hq, n_seg, p_max, dtype=index_dtype, device=q.device)
    if p_max == 0:
        return q_perm, kv_perm
    q_mean = q_mean.view(B, Hkv, group, n_seg, D)
    fits = k.stride(-1) == 1 and not D & (D - 1) and D >= 16  # the key-score kernel's layout
    fused = fused_scores
    if fused is None:
        fused = fits and k.is_cuda and k.dtype == torch.bfloat16
    elif fused and not fits:
        raise ValueError(f"the key-score kernel needs a contiguous power-of-two head_dim >= 16, "
                         f"got D={D}, stride {k.stride(-1)}")  # fmt: skip
    if not fused:
        # fp32 scores, never tf32; converting all of a contiguous k and slicing after is a
        # vectorized copy (a strided slice first was 2x slower on an H200)
        kf = (k.float() if k.is_contiguous() else k[:, :, :p_max].float())[:, :, :p_max]
    else:
        qx, kx = _score_operands(q_mean, k)
    groups = _sort_groups(prefix, B * Hq, sort_mode, score_bits=score_bits)
    kv_perm[:, :, : groups[0][0]] = -1  # segments with an empty prefix
    for a, b in groups:
        width = prefix[b - 1]
        if fused:
            s_k, keys = _fused_group(
                qx, kx, (B, Hkv, group, n_seg), prefix, a, b, sort_mode, S, local_window,
                score_bits,
            )  # fmt: skip
        else:
            qm = q_mean[:, :, :, a:b].reshape(B, Hkv, group * (b - a), D)
            s_k = torch.matmul(qm, kf[:, :, :width].transpose(-1, -2)).view(B, Hq, b - a, width)
            keys = None
        _rank_chunk(s_k, kv_perm, prefix, a, S, local_window, sort_mode, keys, masked=fused,
                    score_bits=score_bits)  # fmt: skip
    return q_perm, kv_perm
