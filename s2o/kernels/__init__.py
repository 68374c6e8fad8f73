"""Triton kernels for S2O (Step 1, Pass-1, Pass-2, fused). Never imports ``s2o.reference``.

Public entry points: :func:`s2o_step1` (index arrays) and :func:`s2o_triton` (attention + stats).
Both keep the specification's layouts, so ``s2o_triton(perms=s2o_step1(...))`` and the reference's
``perms`` are interchangeable.
"""

from __future__ import annotations

import torch

from ..dense_tail import tail_last
from ..stats import AttentionStats, s2o_stats
from .launch import HEAD_DIMS, Launch, check_head_dim
from .s2o_attention import STOP_CHUNK, s2o_fused, s2o_pass1, s2o_pass2
from .s2o_step1 import s2o_step1

# kv_perm's dtype where Step 1 feeds the kernels' walk (the S2O method, s2o_triton without perms):
# int32 halves the index bytes the walk gathers through and Step 1 writes; the values are those
# of the specification's int64 layout, so the decisions are the same (the measured effect:
# results/kernels/run10_h100/README.md)
WALK_INDEX_DTYPE = torch.int32

__all__ = [
    "s2o_step1", "s2o_triton", "s2o_pass1", "s2o_pass2", "s2o_fused", "Launch", "HEAD_DIMS",
    "STOP_CHUNK", "WALK_INDEX_DTYPE", "check_head_dim",
]  # fmt: skip


def s2o_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    variant: str = "two_pass",
    segment_len: int,
    tau: float,
    block_m: int,
    block_n: int,
    local_window: int = 0,
    q_perm: bool = True,
    scale: float | None = None,
    perms: tuple[torch.Tensor, torch.Tensor] | None = None,
    stop_tile: str = "keep",
    out: torch.Tensor | None = None,
    walk_budget: int | None = None,
    causal: bool = True,
    step1_sort: str | None = None,
    launch: dict[str, Launch] | None = None,
    stop_chunk: tuple[int, int] | None = None,
    descriptors: bool | None = None,
    topk_ratio: float | None = None,
    dense_tail: int = 0,
    tail_rank: int = 0,
) -> tuple[torch.Tensor, AttentionStats]:
    """S2O attention with the Triton kernels; inputs are assumed validated (see ``s2o.api``).

    Args:
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]`` (fp16/bf16; fp32 for the interpreter);
            ``D`` in :data:`HEAD_DIMS` (another head size is refused before any work).
        variant: ``"two_pass"`` (Pass-1 buffers, then Pass-2) or ``"fused"`` (single pass,
            original query order; ``q_perm`` must be False).
        q_perm: walk queries in ``Q_perm`` order (two_pass only).
        perms: ``(q_perm [B, Hq, L], kv_perm [B, Hq, N, P_max])`` from :func:`s2o_step1` or the
            reference (int64 or int32), made with the same ``causal``.
        stop_tile: ``"keep"`` (the paper's kernel, deferred check) or ``"discard"`` the key tile
            that triggers the stop; the decisions and visits are the same.
        out: optional contiguous ``[B, Hq, L, D]`` output buffer (tests pass a NaN-filled one).
        walk_budget: at most this many Pass-2 key tiles per query tile (``None``: no cap).
        causal: False: each query sees its whole segment and Step 1 ranks every key outside it.
        step1_sort: Step 1's ``sort_mode`` when ``perms`` is None (default ``"chunks"``).
        launch: per kernel (``"pass1"``, ``"pass2"``, ``"fused"``) a
            :class:`~s2o.kernels.launch.Launch`; missing kernels and fields take the defaults for
            the head size and GPU. The tiles counted (``block_m x block_n``) never change.
        stop_chunk: ``(first chunk, growth)`` of the early-stop walk (default :data:`STOP_CHUNK`).
        descriptors: TMA loads of contiguous K/V tiles (None: automatic).
        topk_ratio: S2O's top-k mode (see :mod:`s2o.reference`): each Pass-2 query tile walks
            the first ``ceil(topk_ratio * ranked tiles)`` key tiles, no early stop (``tau``
            must be ``<= 0``); ``None``: off.
        dense_tail: a named variant (:mod:`s2o.dense_tail`; 0: off): the query tiles holding the
            last ``dense_tail`` rows walk their whole ranked prefix; with ``perms``, they must
            come from Step 1 followed by :func:`s2o.dense_tail.tail_last`.
        tail_rank: a named variant (:mod:`s2o.tail_rank`; 0: off): the query tiles holding the
            last ``tail_rank`` rows walk a ranking by the tail's own mean query, with the stop
            rule; with ``perms``, they must come from :func:`s2o_step1` with the same
            ``tail_rank`` (or the reference's Step 1 with it).
    Returns:
        ``out`` ``[B, Hq, L, D]`` and :class:`AttentionStats` with the reference's ``extra``:
        ``pass2_tiles`` ``[B, Hq, n_query_tiles]`` int64, ``pass2_tiles_max``, ``pass1_tiles``.
    """
    L = q.shape[2]
    check_head_dim(q.shape[-1])
    launch = launch or {}
    unknown = set(launch) - {"pass1", "pass2", "fused"}
    if unknown:
        raise ValueError(f"launch settings for unknown kernels {sorted(unknown)}")
    geo = dict(segment_len=segment_len, local_window=local_window, block_m=block_m, block_n=block_n,
               causal=causal)  # fmt: skip
    if perms is None:
        perms = s2o_step1(q, k, segment_len=segment_len, local_window=local_window,
                          sort_mode=step1_sort, causal=causal, tail_rank=tail_rank,
                          index_dtype=WALK_INDEX_DTYPE)  # fmt: skip
        perms = (tail_last(perms[0], segment_len, dense_tail), perms[1])
    qp, kvp = perms
    walk = dict(tau=tau, scale=scale, stop_tile=stop_tile, out=out, walk_budget=walk_budget,
                stop_chunk=stop_chunk, topk_ratio=topk_ratio, dense_tail=dense_tail,
                tail_rank=tail_rank)  # fmt: skip
    if variant == "fused":
        if q_perm:
            raise ValueError("variant='fused' does not reorder queries: q_perm must be False")
        out, visited = s2o_fused(
            q, k, v, kvp, launch=launch.get("fused"), descriptors=descriptors, **walk, **geo
        )
    else:
        state = s2o_pass1(
            q, k, v, scale=scale, launch=launch.get("pass1"), descriptors=descriptors, **geo
        )
        out, visited = s2o_pass2(
            q, k, v, state, qp, kvp, use_qperm=bool(q_perm), launch=launch.get("pass2"), **walk,
            **geo,
        )  # fmt: skip
    geometry = (L, segment_len, local_window, block_m, block_n)
    stats = s2o_stats(visited, *geometry, walk_budget, causal, topk_ratio)
    return out, stats
