"""The public S2O function :func:`s2o_attention`: an alias of ``sparse_attention("s2o", ...)``.

S2O has one front door, the method registry (:mod:`s2o.methods.s2o`: its knobs are
:data:`~s2o.methods.s2o.DEFAULTS`, validated once by ``Method.bind``, dispatched to the reference
or the Triton kernels there, never falling back silently). :func:`s2o_attention` keeps its
explicit keywords for users' code and passes them on unchanged; ``check_s2o_args`` and
``resolve_impl`` stay importable from here.
"""

from __future__ import annotations

import torch

from .methods.registry import sparse_attention
from .methods.s2o import DEFAULTS, STOP_TILES, VARIANTS, check_s2o_args
from .stats import AttentionStats
from .validation import IMPLS, check_bool, resolve_impl

__all__ = [
    "IMPLS", "STOP_TILES", "VARIANTS", "check_s2o_args", "resolve_impl", "s2o_attention",
]  # fmt: skip


def s2o_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_len: int = 2048,
    tau: float = 0.005,
    block_m: int = 128,
    block_n: int = 128,
    local_window: int = 0,
    q_perm: bool | None = None,
    variant: str = "two_pass",
    scale: float | None = None,
    impl: str = "auto",
    return_stats: bool = False,
    stop_tile: str = "keep",
    walk_budget: int | None = None,
    causal: bool = True,
    topk_ratio: float | None = None,
    dense_tail: int = 0,
    tail_rank: int = 0,
    mean_correction: bool = False,
    step1_score_bits: int = 32,
) -> torch.Tensor | tuple[torch.Tensor, AttentionStats]:
    """S2O sparse prefill attention, causal by default: ``sparse_attention("s2o", q, k, v,
    **knobs)`` (the canonical entry point, which also takes ``step1_sort`` and ``launch``), with
    ``return_stats`` choosing whether the stats come back. The keywords' defaults are
    :data:`s2o.methods.s2o.DEFAULTS`.

    Args:
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]`` with ``Hq % Hkv == 0`` (GQA, K/V are
            not repeated). fp16, bf16 or fp32, all on one device.
        segment_len: ``S``, tokens per segment; a multiple of ``block_m`` and ``block_n``.
        tau: early-stop threshold; ``tau <= 0`` never stops (exact dense causal attention).
        block_m, block_n: query and key tile sizes; also the unit of the sparsity statistics.
        local_window: keys just before each segment computed densely (multiple of ``block_n``).
        q_perm: reorder queries inside segments (Alg. 1 (i)). ``None`` means True for
            ``variant="two_pass"`` and False for ``"fused"``, which never reorders queries.
        variant: ``"two_pass"`` (Pass-1 buffers + Pass-2) or ``"fused"`` (single pass).
        scale: softmax scale, default ``1/sqrt(D)``.
        impl: ``"auto"`` (Triton for CUDA tensors, reference on CPU), ``"reference"`` or
            ``"triton"``; an explicit choice never falls back. The Triton kernels take head_dim
            16, 32, 64, 128 or 256 (256 computes each key tile in 64-key parts; the tiles
            counted stay ``block_m x block_n``); another head size is refused, naming it.
        return_stats: also return :class:`AttentionStats` (``.sparsity`` float,
            ``.sparsity_per_head`` ``[B, Hq]``).
        stop_tile: ``"keep"`` (the paper's kernel: deferred check, the tile that triggers the stop
            is added) or ``"discard"`` (Alg. 3 as printed). Same decisions and tile counts.
        walk_budget: at most this many Pass-2 key tiles per query tile (``None``: no cap; ``0``:
            local window and own segment only).
        causal: False: each query sees its whole segment densely and Step 1 ranks every key
            outside it (window and own segment excepted); sparsity counts against the dense
            non-causal tile count.
        topk_ratio: S2O's top-k mode (the paper's comparison with block-sparse attention): each
            Pass-2 query tile walks the first ``ceil(topk_ratio * ranked tiles)`` key tiles of its
            ranked prefix with no early stop; needs ``tau <= 0``. ``None``: off.
        dense_tail: a named variant, not the paper's method (:mod:`s2o.dense_tail`; 0: off): the
            query tiles holding the last ``dense_tail`` rows walk their whole ranked prefix
            without early stop, so those rows get exact dense attention; their tiles count in
            the density.
        tail_rank: a named variant, not the paper's method (:mod:`s2o.tail_rank`; 0: off): the
            query tiles holding the last ``tail_rank`` rows walk their prefix ranked by the
            tail's own mean query, with the normal stop rule; their tiles count in the density.
        mean_correction: a named variant, not the paper's method (:mod:`s2o.mean_correction`;
            False: off): the ranked keys a query tile's walk skipped enter its softmax as the
            mean key and value of each ranked tile of ``block_n`` keys (``n`` copies each).
            Reference path only: refused where ``impl`` resolves to ``'triton'``.
        step1_score_bits: a named variant (:func:`s2o.reference.score_buckets`; 32: the fp32
            scores, the paper's ranking): 16 or 24 ranks each segment's keys by the top bits of
            their scores, ties by position. The Triton path needs ``step1_sort="cub"``, which
            ``sparse_attention("s2o", ...)`` takes; here it runs on the reference path.
    Returns:
        ``out`` ``[B, Hq, L, D]`` in q's dtype, or ``(out, stats)``.
    Raises:
        ValueError: a bad shape, dtype or knob; NaN/Inf in q, k or v (naming tensor and
            position); inputs that require grad (inference only); bf16 on the Triton interpreter.
    """
    knobs = {name: value for name, value in locals().items() if name in DEFAULTS}
    check_bool("return_stats", return_stats)
    out, stats = sparse_attention("s2o", q, k, v, **knobs)
    return (out, stats) if return_stats else out
