"""Public S2O entry point: validate, pick an implementation, never fall back silently."""

from __future__ import annotations

import os

import torch

from .dense_tail import check_dense_tail
from .reference import s2o_reference
from .stats import AttentionStats, check_topk_ratio, refuse_topk_with_early_stop
from .tail_rank import check_tail_rank
from .validation import (
    check_bool,
    check_choice,
    check_finite,
    check_inference_inputs,
    check_interpreter_dtype,
    check_positive_int,
    check_qkv,
    check_scale,
    check_tile,
)

VARIANTS = ("two_pass", "fused")
STOP_TILES = ("keep", "discard")
IMPLS = ("auto", "reference", "triton")


def _triton_usable(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def resolve_impl(impl: str, device: torch.device) -> str:
    """``auto`` -> Triton for CUDA tensors, reference otherwise; an explicit choice is checked."""
    check_choice("impl", impl, IMPLS)
    if impl == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if impl == "triton" and not _triton_usable(device):
        raise ValueError(
            f"impl='triton' needs CUDA tensors (got device {device}); set TRITON_INTERPRET=1 "
            "to run the kernels on the CPU interpreter, or use impl='reference'"
        )
    return impl


def check_s2o_args(
    *,
    segment_len,
    tau,
    block_m,
    block_n,
    local_window,
    q_perm,
    variant,
    scale,
    stop_tile="keep",
    walk_budget=None,
) -> bool:
    """Validate the S2O knobs; returns the effective ``q_perm``."""
    check_choice("stop_tile", stop_tile, STOP_TILES)
    if walk_budget is not None and (
        isinstance(walk_budget, bool) or not isinstance(walk_budget, int) or walk_budget < 0
    ):
        raise ValueError(f"walk_budget must be None or an int >= 0, got {walk_budget!r}")
    check_positive_int("segment_len", segment_len)
    check_tile("block_m", block_m)
    check_tile("block_n", block_n)
    check_finite("tau", tau)
    check_choice("variant", variant, VARIANTS)
    if segment_len % block_m or segment_len % block_n:
        raise ValueError(
            f"segment_len={segment_len} must be a multiple of block_m={block_m} "
            f"and block_n={block_n}"
        )
    if isinstance(local_window, bool) or not isinstance(local_window, int) or local_window < 0:
        raise ValueError(f"local_window must be an int >= 0, got {local_window!r}")
    if local_window % block_n:
        raise ValueError(f"local_window={local_window} must be a multiple of block_n={block_n}")
    check_scale(scale)
    if q_perm is None:
        return variant == "two_pass"
    if q_perm and variant == "fused":
        raise ValueError("variant='fused' does not reorder queries: q_perm=True is not supported")
    if not isinstance(q_perm, bool):
        raise ValueError(f"q_perm must be a bool or None, got {q_perm!r}")
    return q_perm


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
) -> torch.Tensor | tuple[torch.Tensor, AttentionStats]:
    """S2O sparse prefill attention, causal by default.

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
    Returns:
        ``out`` ``[B, Hq, L, D]`` in q's dtype, or ``(out, stats)``.
    Raises:
        ValueError: a bad shape, dtype or knob; NaN/Inf in q, k or v (naming tensor and
            position); inputs that require grad (inference only); bf16 on the Triton interpreter.
    """
    check_qkv(q, k, v)
    check_inference_inputs(q, k, v)
    check_bool("return_stats", return_stats)
    use_q_perm = check_s2o_args(
        segment_len=segment_len, tau=tau, block_m=block_m, block_n=block_n,
        local_window=local_window, q_perm=q_perm, variant=variant, scale=scale,
        stop_tile=stop_tile, walk_budget=walk_budget,
    )  # fmt: skip
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    topk_ratio = check_topk_ratio(topk_ratio)
    refuse_topk_with_early_stop(topk_ratio, tau)
    check_dense_tail(dense_tail, topk_ratio=topk_ratio, walk_budget=walk_budget, causal=causal)
    check_tail_rank(tail_rank, dense_tail=dense_tail, causal=causal)
    knobs = dict(
        segment_len=segment_len, tau=float(tau), block_m=block_m, block_n=block_n,
        local_window=local_window, q_perm=use_q_perm, scale=scale, stop_tile=stop_tile,
        walk_budget=walk_budget, causal=causal, topk_ratio=topk_ratio, dense_tail=dense_tail,
        tail_rank=tail_rank,
    )  # fmt: skip
    chosen = resolve_impl(impl, q.device)
    check_interpreter_dtype(chosen, q)
    if chosen == "reference":
        out, stats = s2o_reference(q, k, v, **knobs)
    else:
        from .kernels import s2o_triton

        out, stats = s2o_triton(q, k, v, variant=variant, **knobs)
    return (out, stats) if return_stats else out
