"""S2O in plain PyTorch: the specification the Triton kernels are tested against.

Paper: "S2O: Early Stopping for Sparse Attention via Online Permutation", Section 3 (Algorithms 1-3)
and the appendix single-pass algorithm. Everything here runs on the CPU and accumulates in fp32.

Layout: q ``[B, Hq, L, D]``, k and v ``[B, Hkv, L, D]``, ``Hq % Hkv == 0`` (query head ``h`` reads
key/value head ``h // (Hq // Hkv)``), prefill with equal query and key lengths, causal by default.

Definitions (the kernels follow them exactly):

* **Segments.** Segment ``n`` holds tokens ``[n*S, min((n+1)*S, L))``; the last one may be shorter
  and ``L < S`` gives one segment.
* **Step 1 (Alg. 1).** ``q_mean[n]``/``k_mean[n]`` are means over the tokens of segment ``n``.
  ``k_guide = k_mean[0]`` of the key head. ``Q_perm`` orders the queries of each segment by
  descending ``<q, k_guide>``; ``KV_perm[n]`` orders the *ranked prefix* ``t < P_n`` by descending
  ``<q_mean[n], k_t>``, where ``P_n = max(0, n*S - W)`` excludes the ``W = local_window`` keys that
  are computed densely (``W = 0`` is Alg. 1 as printed). Scores are fp32 dot products without the
  softmax scale (a positive factor does not change an order); ties keep ascending token order.
  Indices are absolute token positions.
* **Non-causal** (``causal=False``, the paper's ABCD and BSA studies): segment ``n``'s ranked set
  is every key outside ``[max(0, n*S - W), e_n)`` (``e_n`` its end), ``P_n = L - (e_n - max(0,
  n*S - W))`` keys ranked the same way; Pass-1 attends to the window and the *whole* own segment.
  Everything else is unchanged.
* **Pass-1 (Alg. 2) + local window.** Every query ``i`` of segment ``n`` attends densely, in
  original order, to keys ``[max(0, n*S - W), i]``: the local window and the causal part of its
  own segment.
  This gives its online-softmax state ``(m, l, acc)``.
* **Pass-2 (Alg. 3).** The queries of a segment, in ``Q_perm`` order (original order when
  ``q_perm=False``), form tiles of ``block_m`` rows. Each tile walks ``KV_perm[n][:P_n]`` in tiles
  of ``block_n`` keys (the last one may be shorter). For a key tile, with ``m' = max(m, rowmax(s))``
  the gain of row ``r`` is ``g_r = sum_t exp(s_rt - m')`` and its accumulated mass in the same scale
  is ``l_r * exp(m_r - m')``.
* **The stop rule (tile level).** A row *gains* when ``g_r >= tau * l_r * exp(m_r - m')`` (the
  paper's ``delta_l >= tau * l``). If no valid row of the tile gains, the walk stops after this key
  tile; otherwise all rows of the tile take the update and the walk goes on. What happens to the
  tile that triggers the stop is ``stop_tile``: ``"keep"`` (default) adds it, which is the paper's
  kernel (Appendix, variant D: the ratio is computed after ``P V`` and checked at the start of the
  next iteration); ``"discard"`` drops it, which is Alg. 3 as printed. Both make the same decisions
  and visit the same tiles; the triggering tile counts as processed either way, because its
  ``Q K^T`` was computed. ``tau <= 0`` never stops, which makes the output exact dense causal
  attention.
* **Walk budget.** ``walk_budget`` caps Pass-2 at that many key tiles per query tile (``None``:
  no cap). ``0`` skips Pass-2 entirely: the "local window only" ablation, with exact tile counts.
* **Top-k mode** (``topk_ratio = r`` in ``(0, 1]``; the paper's comparison with block-sparse
  attention, Appendix Fig. 5, "top-k selection based on Kernel C"). Pass-2 of a query tile of
  segment ``n`` walks exactly the first ``ceil(r * ceil(P_n / block_n))`` tiles of its ranked
  prefix, i.e. its first ``min(P_n, that * block_n)`` keys, with no stop rule: ``tau`` must be
  ``<= 0`` (the method refuses ``tau > 0`` with ``topk_ratio``; here ``tau > 0`` is an error
  too). ``r`` is read as the decimal it prints as (``0.07`` of 100 tiles is 7 tiles, see
  :func:`~s2o.stats.topk_walk_tiles`). Pass-1 (window and own segment) stays dense. With
  ``walk_budget`` as well, the smaller cap wins.
* **Fused variant (appendix algorithm).** No query reordering; Pass-1, local window and the ranked
  walk run back to back on one state. Arithmetically it is Pass-2 with ``q_perm=False``; the fused
  kernel only keeps ``(m, l, acc)`` in registers instead of HBM buffers.
* **Mean correction** (``mean_correction=True``, a named variant, not the paper's method:
  :mod:`s2o.mean_correction`). After its walk, a Pass-2 query tile's softmax also takes every
  ranked tile (``block_n`` keys of its ranked prefix, in walk order) that the walk did not take,
  as one logit ``scale * q . K̄ + log(n)`` with value ``V̄`` (``n`` keys, fp32 means).
* **Statistics.** A processed tile is one ``block_m x block_n`` query-key tile whose ``Q K^T`` was
  computed: Pass-1 tiles (window + own segment, causal, fully masked tiles skipped) plus the key
  tiles each Pass-2 query tile visited. Density = processed / :func:`dense_causal_tile_count`.
"""

from __future__ import annotations

import math

import torch

from .dense_tail import forced_tiles, tail_last
from .mean_correction import merge_pooled
from .stats import (
    AttentionStats,
    _cdiv,
    refuse_topk_with_early_stop,
    s2o_ranked_len,
    s2o_stats,
    s2o_walk_tiles,
)
from .tail_rank import kv_rows, tail_rows, tail_tiles


def segment_ranges(seq_len: int, segment_len: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of every segment; the last may be shorter than ``segment_len``."""
    return [(s, min(s + segment_len, seq_len)) for s in range(0, seq_len, segment_len)]


def ranked_prefix_len(segment_start: int, local_window: int) -> int:
    """Number of keys segment ``[segment_start, ...)`` ranks and walks in Pass-2: ``P_n``."""
    return max(0, segment_start - local_window)


SCORE_BITS = (16, 24, 32)  # Step 1's score_bits: 32 ranks the fp32 scores (the paper's Step 1)


def score_buckets(s: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 ``[0, 2**bits)``: the top ``bits`` bits of the order-preserving uint32 image of fp32
    ``s`` (``-0.0`` as ``+0.0``, NaN above everything): a larger score never gets a smaller
    bucket, and scores that share the top bits share one. Step 1's ``score_bits`` ranks by it."""
    b = s.float().contiguous().view(torch.int32).long()
    asc = torch.where(b < 0, b ^ 0x7FFFFFFF, b)
    asc = torch.where((b & 0x7FFFFFFF) == 0, 0, asc)
    asc = torch.where(s != s, 2**31 - 1, asc)
    return (asc + 2**31) >> (32 - bits)


def s2o_permutations(
    q: torch.Tensor,
    k: torch.Tensor,
    segment_len: int,
    local_window: int = 0,
    causal: bool = True,
    dense_tail: int = 0,
    tail_rank: int = 0,
    score_bits: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 (Alg. 1): the index arrays, nothing else is moved. ``dense_tail`` (a named
    variant, :mod:`s2o.dense_tail`): the last ``dense_tail`` rows leave ``Q_perm``'s order.
    ``tail_rank`` (a named variant, :mod:`s2o.tail_rank`): so do the last ``tail_rank`` rows, and
    ``kv_perm`` gets one more row per segment holding them, ranked by their own mean query.
    ``score_bits`` < 32 (a named variant; causal, no ``tail_rank``): ``kv_perm`` ranks the keys
    by :func:`score_buckets` of their scores, ties in ascending position (32: the fp32 scores).

    Args:
        q: ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``.
    Returns:
        q_perm: ``[B, Hq, L]`` int64. ``q_perm[..., s:e]`` is a permutation of ``s..e-1`` for every
            segment ``[s, e)``: absolute query positions in descending ``<q, k_guide>`` order.
        kv_perm: ``[B, Hq, N, P_max]`` int64, ``P_max = max_n P_n``. Row ``n`` holds the ranked
            prefix ``0..P_n-1`` (non-causal: the keys outside the window and the own segment) in
            descending ``<q_mean[n], k>`` order, padded with ``-1``. With ``tail_rank``:
            ``[B, Hq, N + N_tail, P_max]``, the tail rows after the segments'
            (:func:`s2o.tail_rank.tail_rows`).
    """
    B, Hq, L, D = q.shape
    group = Hq // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)
    segs = segment_ranges(L, segment_len)

    k_guide = kf[:, :, segs[0][0] : segs[0][1]].mean(dim=2)  # [B, Hq, D]
    s_q = torch.einsum("bhld,bhd->bhl", qf, k_guide)
    q_perm = torch.empty(B, Hq, L, dtype=torch.long, device=q.device)
    for s, e in segs:
        order = torch.sort(s_q[:, :, s:e], dim=-1, descending=True, stable=True).indices
        q_perm[:, :, s:e] = order + s
    q_perm = tail_last(q_perm, segment_len, dense_tail)
    q_perm = tail_last(q_perm, segment_len, tail_rank)

    q_mean = torch.stack([qf[:, :, s:e].mean(dim=2) for s, e in segs], dim=2)  # [B, Hq, N, D]
    s_k = torch.einsum("bhnd,bhld->bhnl", q_mean, kf)
    pos = torch.arange(L, device=q.device)
    prefix = [s2o_ranked_len(L, s, segment_len, local_window, causal) for s, _ in segs]
    prefix = torch.tensor(prefix, device=q.device)
    if causal:
        beyond = pos[None, :] >= prefix[:, None]  # [N, L]
    else:
        lo = torch.tensor([max(0, s - local_window) for s, _ in segs], device=q.device)
        end = torch.tensor([e for _, e in segs], device=q.device)
        beyond = (pos[None, :] >= lo[:, None]) & (pos[None, :] < end[:, None])
    s_k = s_k.masked_fill(beyond, float("-inf"))
    p_max = int(prefix.max())
    if score_bits < 32:
        if not causal or tail_rank:
            raise ValueError(f"score_bits={score_bits} ranks a causal prefix without tail_rank")
        s_k = score_buckets(s_k, score_bits).masked_fill(beyond, -1)
    kv_perm = torch.sort(s_k, dim=-1, descending=True, stable=True).indices[..., :p_max].clone()
    kv_perm.masked_fill_(torch.arange(p_max, device=q.device) >= prefix[:, None], -1)
    if tail_rank:
        tail = _tail_rankings(qf, kf, segs, prefix, segment_len, tail_rank)
        kv_perm = torch.cat([kv_perm, tail], dim=2)
    return q_perm, kv_perm


def _tail_rankings(qf, kf, segs, prefix, segment_len, tail_rank) -> torch.Tensor:
    """``tail_rank``'s rows of ``kv_perm`` ``[B, Hq, N_tail, P_max]``: for every segment holding
    tail rows, its ranked prefix in descending ``<mean of its tail rows' queries, k>`` order."""
    L = qf.shape[2]
    p_max = int(prefix.max())
    start = max(0, L - tail_rank)
    n0, _ = tail_rows(L, segment_len, tail_rank)
    rows = []
    for n in range(n0, len(segs)):
        s, e = segs[n]
        q_tail = qf[:, :, max(s, start) : e].mean(dim=2)  # [B, Hq, D]
        p = int(prefix[n])
        s_k = torch.einsum("bhd,bhld->bhl", q_tail, kf[:, :, :p])
        order = torch.sort(s_k, dim=-1, descending=True, stable=True).indices
        rows.append(torch.nn.functional.pad(order, (0, p_max - p), value=-1))
    return torch.stack(rows, dim=2)


def _pass1_state(q_seg, k, v, seg_start, local_window, scale, causal=True):
    """Dense attention of the queries of one segment over ``[seg_start - W, i]`` (causal) or
    ``[seg_start - W, segment end)``.

    Args: q_seg ``[B, H, R, D]`` (segment rows in original order), k/v ``[B, H, L, D]`` repeated.
    Returns the online-softmax state ``(m [B,H,R], l [B,H,R], acc [B,H,R,D])`` in fp32.
    """
    lo = max(0, seg_start - local_window)
    rows = q_seg.shape[2]
    ks, vs = k[:, :, lo : seg_start + rows], v[:, :, lo : seg_start + rows]
    s = torch.einsum("bhrd,bhtd->bhrt", q_seg, ks) * scale
    row_pos = seg_start + torch.arange(rows, device=q_seg.device)
    key_pos = lo + torch.arange(ks.shape[2], device=q_seg.device)
    if causal:
        s = s.masked_fill(key_pos[None, :] > row_pos[:, None], float("-inf"))
    m = s.amax(dim=-1)
    p = torch.exp(s - m[..., None])
    return m, p.sum(dim=-1), torch.einsum("bhrt,bhtd->bhrd", p, vs)


def _pass2_walk(q_rows, state, k, v, ranked, block_m, block_n, tau, scale, keep_stop_tile,
                forced=range(0)):  # fmt: skip
    """Pass-2 (Alg. 3) for all query tiles of one segment at once, each tile stopping on its own.

    Args:
        q_rows: ``[B, H, R, D]`` fp32 queries in walk order (permuted or not).
        state: ``(m, l, acc)`` for those rows, updated in place.
        ranked: ``[B, H, P]`` key positions in walk order.
        forced: query tiles that never stop (``dense_tail``).
    Returns:
        visited: ``[B, H, T]`` key tiles each query tile processed (the discarded one included);
        taken: ``[B, H, T]`` those whose keys entered the output (``visited`` less a discarded
        one), a prefix of the walk.
    """
    m, l, acc = state
    B, H, R, D = q_rows.shape
    n_tiles = _cdiv(R, block_m)
    pad = n_tiles * block_m - R
    valid = torch.arange(n_tiles * block_m, device=q_rows.device).view(n_tiles, block_m) < R
    active = torch.ones(B, H, n_tiles, dtype=torch.bool, device=q_rows.device)
    visited = torch.zeros(B, H, n_tiles, dtype=torch.long, device=q_rows.device)
    taken = torch.zeros_like(visited)
    never_stop = torch.zeros(n_tiles, dtype=torch.bool, device=q_rows.device)
    never_stop[list(forced)] = True
    for j in range(_cdiv(ranked.shape[-1], block_n)):
        if not bool(active.any()):
            break
        idx = ranked[:, :, j * block_n : (j + 1) * block_n]
        gather = idx[..., None].expand(-1, -1, -1, D)
        kt, vt = torch.gather(k, 2, gather), torch.gather(v, 2, gather)
        s = torch.einsum("bhrd,bhtd->bhrt", q_rows, kt) * scale
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[..., None])
        gain = p.sum(dim=-1)
        l_old = l * torch.exp(m - m_new)
        if tau > 0:
            row_gains = torch.nn.functional.pad(gain >= tau * l_old, (0, pad))
            row_gains = row_gains.view(B, H, n_tiles, block_m) & valid
            keep_tile = active & (row_gains.any(dim=-1) | never_stop)
        else:
            keep_tile = active
        visited += active.long()
        take = active if keep_stop_tile else keep_tile
        taken += take.long()
        active = keep_tile
        keep = take.repeat_interleave(block_m, dim=-1)[..., :R]
        alpha = torch.exp(m - m_new)
        m.copy_(torch.where(keep, m_new, m))
        l.copy_(torch.where(keep, l_old + gain, l))
        upd = acc * alpha[..., None] + torch.einsum("bhrt,bhtd->bhrd", p, vt)
        acc.copy_(torch.where(keep[..., None], upd, acc))
    return visited, taken


def _walk_split(q_rows, state, k, v, ranked, ranked_tail, cut, walk, pooled=(None, None)):
    """:func:`_pass2_walk` for a segment whose walk slots from ``cut`` (a tile boundary) on walk
    ``ranked_tail`` (``tail_rank``): the two groups of tiles walk apart, each tile stopping on
    its own as always. ``state`` is updated in place through views. ``pooled``: each group's
    whole ranked prefix for ``mean_correction`` (None: off). Returns ``(visited, pooled
    tiles)`` per query tile (the latter None when off)."""
    parts = []
    groups = ((slice(0, cut), ranked, pooled[0]), (slice(cut, None), ranked_tail, pooled[1]))
    for rows, order, prefix in groups:
        if rows.stop == 0:
            continue
        part = [x[:, :, rows] for x in state]
        parts.append(_walk(q_rows[:, :, rows], part, k, v, order, walk, prefix))
    visited, merged = zip(*parts, strict=True)
    return torch.cat(visited, dim=-1), None if merged[0] is None else torch.cat(merged, dim=-1)


def _walk(q_rows, state, k, v, ranked, walk, pooled=None):
    """:func:`_pass2_walk`, then (``pooled``: the whole ranked prefix, ``mean_correction``) the
    ranked tiles the walk did not take merged through their means
    (:func:`s2o.mean_correction.merge_pooled`). Returns ``(visited, pooled tiles or None)``."""
    visited, taken = _pass2_walk(q_rows, state, k, v, ranked, *walk)
    if pooled is None:
        return visited, None
    block_m, block_n, _, scale = walk[:4]
    return visited, merge_pooled(q_rows, state, k, v, pooled, taken, block_m, block_n, scale)


def s2o_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_len: int,
    tau: float,
    block_m: int,
    block_n: int,
    local_window: int = 0,
    q_perm: bool = True,
    scale: float | None = None,
    perms: tuple[torch.Tensor, torch.Tensor] | None = None,
    stop_tile: str = "keep",
    walk_budget: int | None = None,
    causal: bool = True,
    topk_ratio: float | None = None,
    dense_tail: int = 0,
    tail_rank: int = 0,
    mean_correction: bool = False,
) -> tuple[torch.Tensor, AttentionStats]:
    """S2O attention (Step 1 + Pass-1 + Pass-2) in plain PyTorch; inputs are assumed validated.

    Args:
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]``.
        q_perm: order queries by ``Q_perm`` inside each segment (False: original order, which is
            also the arithmetic of the fused single-pass variant).
        perms: ``(q_perm, kv_perm)`` from :func:`s2o_permutations` with the same ``segment_len``
            and ``local_window``; computed here when None.
        stop_tile: ``"keep"`` or ``"discard"`` the key tile that triggers the stop (see above).
        walk_budget: at most this many Pass-2 key tiles per query tile; ``None``: no cap.
        causal: False: Pass-1 covers the whole own segment and Step 1 ranks every key outside
            it (see the module docstring); ``perms`` must then be non-causal too.
        topk_ratio: the top-k mode (see the module docstring): each Pass-2 query tile walks the
            first ``ceil(topk_ratio * ranked tiles)`` key tiles of its ranked prefix; needs
            ``tau <= 0``. ``None``: off.
        dense_tail: a named variant (:mod:`s2o.dense_tail`, 0: off, the paper's method): the
            query tiles holding the last ``dense_tail`` rows walk their whole ranked prefix;
            ``perms`` must then come from Step 1 with the same ``dense_tail``.
        tail_rank: a named variant (:mod:`s2o.tail_rank`, 0: off): the query tiles holding the
            last ``tail_rank`` rows walk their segment's tail row of ``kv_perm`` (ranked by the
            tail's own mean query) with the normal stop rule; ``perms`` must then come from
            Step 1 with the same ``tail_rank``.
        mean_correction: a named variant (:mod:`s2o.mean_correction`, False: off): the ranked
            tiles of a query tile's prefix that its walk did not take enter its softmax as
            ``n`` copies of their mean key and mean value.
    Returns:
        out ``[B, Hq, L, D]`` in q's dtype, and :class:`AttentionStats` whose ``extra`` holds
        ``pass2_tiles`` ``[B, Hq, n_query_tiles]`` (key tiles visited per Pass-2 query tile, in
        segment then walk order), ``pass2_tiles_max`` ``[n_query_tiles]`` and ``pass1_tiles``;
        with ``mean_correction`` also ``pooled_tiles`` ``[B, Hq, n_query_tiles]`` (ranked tiles
        merged through their means per query tile).
    """
    B, Hq, L, D = q.shape
    refuse_topk_with_early_stop(topk_ratio, tau)
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q_idx, kv_idx = (
        perms
        if perms is not None
        else s2o_permutations(q, k, segment_len, local_window, causal, dense_tail, tail_rank)
    )
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    out = torch.empty(B, Hq, L, D, dtype=torch.float32, device=q.device)
    visited, merged = [], []
    for n, (s, e) in enumerate(segment_ranges(L, segment_len)):
        m, l, acc = _pass1_state(qf[:, :, s:e], kf, vf, s, local_window, scale, causal)
        order = (
            q_idx[:, :, s:e] if q_perm else torch.arange(s, e, device=q.device).expand(B, Hq, -1)
        )
        local = order - s
        state = [torch.gather(x, 2, local) for x in (m, l)]
        state.append(torch.gather(acc, 2, local[..., None].expand(-1, -1, -1, D)))
        q_rows = torch.gather(qf, 2, order[..., None].expand(-1, -1, -1, D))
        tiles = s2o_walk_tiles(L, s, segment_len, local_window, block_n, walk_budget, topk_ratio,
                               causal)  # fmt: skip
        whole = s2o_ranked_len(L, s, segment_len, local_window, causal)
        prefix = min(whole, tiles * block_n)
        ranked = kv_idx[:, :, n, :prefix]
        forced = forced_tiles(s, e - s, block_m, L, dense_tail)
        walk = (block_m, block_n, tau, scale, stop_tile == "keep", forced)
        own = tail_tiles(s, e - s, block_m, L, tail_rank)
        pooled = kv_idx[:, :, n, :whole] if mean_correction else None
        if len(own):  # tail_rank: the tail's tiles walk the tail's own row of kv_perm
            tail = kv_idx[:, :, n + tail_rows(L, segment_len, tail_rank)[1]]
            both = (pooled, tail[..., :whole] if mean_correction else None)
            got = _walk_split(q_rows, state, kf, vf, ranked, tail[..., :prefix],
                              own.start * block_m, walk, both)  # fmt: skip
        else:
            got = _walk(q_rows, state, kf, vf, ranked, walk, pooled)
        visited.append(got[0])
        merged.append(got[1])
        o = state[2] / state[1][..., None]
        out.scatter_(2, order[..., None].expand(-1, -1, -1, D), o)
    pass2 = torch.cat(visited, dim=-1)
    geometry = (L, segment_len, local_window, block_m, block_n)
    stats = s2o_stats(pass2, *geometry, walk_budget, causal, topk_ratio)
    if mean_correction:
        stats.extra["pooled_tiles"] = torch.cat(merged, dim=-1)
    return out.to(q.dtype), stats


def s2o_visible_keys(
    perms: tuple[torch.Tensor, torch.Tensor],
    pass2_tiles: torch.Tensor,
    rows: torch.Tensor,
    seq_len: int,
    *,
    segment_len: int,
    local_window: int,
    block_m: int,
    block_n: int,
    q_perm: bool,
    causal: bool = True,
    tail_rank: int = 0,
    **_,
) -> torch.Tensor:
    """``[B, Hq, R, L]`` bool: the keys S2O computed for the query positions ``rows`` ``[R]``,
    from Step 1's ``perms`` and the walk lengths ``pass2_tiles`` ``[B, Hq, n_query_tiles]`` of the
    same call (reference or kernels): Pass-1's window and own segment (causal), plus the first
    ``visited x block_n`` ranked keys of the row's Pass-2 query tile (the tile that triggered a
    stop included: its ``Q K^T`` was computed; with ``stop_tile="discard"`` its keys did not enter
    the output). With ``tail_rank`` (:mod:`s2o.tail_rank`) a row of a tail tile walked its
    segment's tail row of ``kv_perm``, and its keys are read from there. Causal prefill only."""
    if not causal:
        raise NotImplementedError("s2o_visible_keys: causal prefill only")
    q_idx, kv_idx = perms
    B, Hq, _ = q_idx.shape
    dev = rows.device
    rows = rows.long()
    R = rows.shape[0]
    keys = torch.arange(seq_len, device=dev)
    seg = rows // segment_len
    seg_start = seg * segment_len
    lo = (seg_start - local_window).clamp_min(0)
    window = (keys[None, :] >= lo[:, None]) & (keys[None, :] <= rows[:, None])  # [R, L]
    P = kv_idx.shape[-1]
    if P == 0 or R == 0:
        return window[None, None].expand(B, Hq, R, seq_len).clone()
    # Every row at once, no host sync. Walk slot: each segment's slice of q_idx is a permutation
    # of the segment, so one inverse over the whole row maps position p to s + its slot.
    if q_perm:
        qi = q_idx.to(dev).long()
        pos = torch.arange(qi.shape[-1], device=dev).expand_as(qi)
        at = torch.empty_like(qi).scatter_(-1, qi, pos)  # at[..., q_idx[..., i]] = i
        slot = at.gather(-1, rows.expand(B, Hq, R)) - seg_start  # [B, Hq, R]
    else:
        slot = (rows - seg_start).expand(B, Hq, R)
    tile = seg_start // block_m + slot // block_m
    walked = torch.gather(pass2_tiles.to(dev).long(), -1, tile) * block_n  # [B, Hq, R]
    if tail_rank:  # the kv_perm row each row's tile walked: [B, Hq, R] instead of [R]
        seg = kv_rows(seg_start + slot, seq_len, segment_len, block_m, tail_rank)
    # rank[b, h, i, t]: the first index of key t in the ranked order of segment segs[i] (P: not
    # ranked); a row walked key t iff rank < min(walked, P). -1 padding goes to key 0 with rank P
    # (a no-op). The segments: the rows' own when they are on the CPU (known without a sync),
    # all of them on a device (no sync there; ranking a few more segments costs little).
    if dev.type == "cpu":
        segs = torch.unique(seg)  # sorted
        seg_at = torch.searchsorted(segs, seg)
    else:
        segs, seg_at = torch.arange(kv_idx.shape[2], device=dev), seg
    kv = kv_idx.to(dev).index_select(2, segs).long()  # [B, Hq, len(segs), P], -1 padded
    # int16 halves the [B, Hq, R, L] gather below on the CPU; a GPU has native 32-bit atomics
    dt = torch.int16 if P < 2**15 and dev.type == "cpu" else torch.int32
    order = torch.arange(P, device=dev, dtype=dt).expand_as(kv)
    rank = torch.full((*kv.shape[:3], seq_len), P, dtype=dt, device=dev)
    rank.scatter_reduce_(-1, kv.clamp_min(0), torch.where(kv >= 0, order, P), "amin")
    if seg.dim() == 1:
        rank = rank.index_select(2, seg_at)  # [B, Hq, R, L]
    else:
        rank = rank.gather(2, seg_at[..., None].expand(-1, -1, -1, seq_len))
    walk = rank < walked.clamp_max(P).to(dt)[..., None]
    return walk | window
