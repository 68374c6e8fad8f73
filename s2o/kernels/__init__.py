"""Triton kernels for S2O (Step 1, Pass-1, Pass-2, fused). Never imports ``s2o.reference``.

Public entry points: :func:`s2o_step1` (index arrays) and :func:`s2o_triton` (attention + stats).
Both keep the specification's layouts, so ``s2o_triton(perms=s2o_step1(...))`` and the reference's
``perms`` are interchangeable.
"""

from __future__ import annotations

import torch

from ..stats import AttentionStats, s2o_stats
from .s2o_attention import (
    s2o_fused,
    s2o_pass1,
    s2o_pass2,
    set_launch_config,
    set_stop_chunk,
)
from .s2o_step1 import s2o_step1, set_step1_config
from .tma import set_descriptor_loads

__all__ = [
    "s2o_step1", "set_step1_config", "s2o_triton", "s2o_pass1", "s2o_pass2", "s2o_fused",
    "set_launch_config", "set_stop_chunk", "set_descriptor_loads",
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
) -> tuple[torch.Tensor, AttentionStats]:
    """S2O attention with the Triton kernels; inputs are assumed validated (see ``s2o.api``).

    Args:
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]`` (fp16/bf16; fp32 for the interpreter).
        variant: ``"two_pass"`` (Pass-1 buffers, then Pass-2) or ``"fused"`` (single pass,
            original query order; ``q_perm`` must be False).
        q_perm: walk queries in ``Q_perm`` order (two_pass only).
        perms: ``(q_perm [B, Hq, L], kv_perm [B, Hq, N, P_max])`` from :func:`s2o_step1` or the
            reference (int64 or int32).
        stop_tile: ``"keep"`` (the paper's kernel, deferred check) or ``"discard"`` the key tile
            that triggers the stop; the decisions and visits are the same.
        out: optional contiguous ``[B, Hq, L, D]`` output buffer (tests pass a NaN-filled one).
        walk_budget: at most this many Pass-2 key tiles per query tile (``None``: no cap).
    Returns:
        ``out`` ``[B, Hq, L, D]`` and :class:`AttentionStats` with the reference's ``extra``:
        ``pass2_tiles`` ``[B, Hq, n_query_tiles]`` int64, ``pass2_tiles_max``, ``pass1_tiles``.
    """
    L = q.shape[2]
    geo = dict(segment_len=segment_len, local_window=local_window, block_m=block_m, block_n=block_n)
    if perms is None:
        perms = s2o_step1(q, k, segment_len=segment_len, local_window=local_window)
    qp, kvp = perms
    if variant == "fused":
        if q_perm:
            raise ValueError("variant='fused' does not reorder queries: q_perm must be False")
        out, visited = s2o_fused(
            q, k, v, kvp, tau=tau, scale=scale, stop_tile=stop_tile, out=out,
            walk_budget=walk_budget, **geo,
        )  # fmt: skip
    else:
        state = s2o_pass1(q, k, v, scale=scale, **geo)
        out, visited = s2o_pass2(
            q, k, v, state, qp, kvp, tau=tau, scale=scale, use_qperm=bool(q_perm),
            stop_tile=stop_tile, out=out, walk_budget=walk_budget, **geo,
        )  # fmt: skip
    stats = s2o_stats(visited, L, segment_len, local_window, block_m, block_n, walk_budget)
    return out, stats
