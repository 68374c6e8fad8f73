"""XAttention (Xu et al., ICML 2025) behind the method interface.

Follows ``xattn_estimate`` + ``find_blocks_chunked`` + ``Xattention_prefill`` of the official code
(mit-han-lab/x-attention, ``xattn/src/Xattention.py``, ``xattn/src/utils.py``,
``xattn/src/kernels.py``):

1. **Antidiagonal scoring.** With stride ``S``, reduced query ``i`` and key ``j`` (``S`` tokens
   each, zero padding) score ``R[i, j] = sum_t q[S*i + S-1-t] . k[S*j + t]``, the antidiagonal of
   each ``S x S`` sub-block, scaled by ``scale / (S * norm)``.
2. **Softmax + block sum.** Causal row softmax in reduced coordinates (``j <= i``), rows past
   ``ceil(L/S)`` zeroed, then summed over each ``(bs/S) x (bs/S)`` tile -> block scores
   ``[B, H, NB, NB]`` (each valid row of reduced scores sums to 1).
3. **Selection** (per query block ``r``): key block 0 and the diagonal are forced; the other blocks,
   sorted descending, are added while the mass accumulated *before* a block (forced blocks
   first) is ``< threshold * row_total``. Blocks above the diagonal are dropped.
4. Block-sparse causal attention with that mask.

Differences from the official code:

* Official: batch 1, ``Hq == Hkv`` (the caller repeats K/V), Triton estimator only on GPUs whose
  name contains "100", reduced scores and block sums stored in the input dtype (bf16), query
  chunks of ``chunk_size`` tokens to bound memory, and the sparse attention in the
  Block-Sparse-Attention CUDA kernel. Here: any batch, native GQA, one fused Triton estimator on any
  GPU (no chunking: ``chunk_size`` only bounds memory and does not change a decision, so it is not a
  knob), fp32 scores, float64 selection as in the official ``find_blocks_chunked``, the shared
  Triton block-sparse kernel.
* ``keep_sink``/``keep_recent`` are not knobs: with causal prefill they only re-set blocks that
  step 3 already forces. ``select_mode`` is fixed to the ``"inverse"`` (antidiagonal) mode that
  ``Xattention_prefill`` uses, ``kdb`` to 1.
* The official ``Xattention_prefill`` default threshold is 0.8; the S2O paper used 0.9 (our
  default).
* ``threshold >= 1`` keeps every causal block (selected directly: the cumulative rule would miss
  blocks whose estimated mass underflows to 0).
* ``scale`` (default ``1/sqrt(D)``) also scales the estimate (official: always ``1/sqrt(D)``).
"""

from __future__ import annotations

import torch

from ..stats import _cdiv
from ..validation import check_finite, check_positive_int, check_scale, resolve_impl
from .blocksparse import (
    BlockPlan,
    block_causal,
    check_block_size,
    check_fraction,
    check_impl,
    pad_len,
    register_block_sparse,
)

DEFAULTS = {
    "threshold": 0.9,
    "stride": 16,
    "block_size": 128,
    "norm": 1.0,
    "scale": None,
    "impl": "auto",
}


def antidiagonal_block_scores(q, k, *, block_size, stride, scale, norm) -> torch.Tensor:
    """Plain-PyTorch steps 1-2 -> ``[B, Hq, NB, NB]`` fp32 (memory ``O(Hq (L/S)^2)``)."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    nb = _cdiv(L, block_size)
    R, rb = nb * block_size // stride, block_size // stride
    qr = pad_len(q.float(), nb * block_size).reshape(B, Hkv, (Hq // Hkv) * R, stride * D)
    kr = pad_len(k.float(), nb * block_size).view(B, Hkv, R, stride, D).flip(3)
    s = (qr @ kr.reshape(B, Hkv, R, stride * D).transpose(-1, -2)).view(B, Hq, R, R)
    s = s * (scale / (stride * norm))
    i = torch.arange(R, device=q.device)
    p = torch.softmax(s.masked_fill(i[None, :] > i[:, None], float("-inf")), dim=-1)
    p = p * (i < _cdiv(L, stride)).to(p.dtype)[:, None]
    return p.view(B, Hq, nb, rb, nb, rb).sum((3, 5))


def select_blocks(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Step 3 on ``[B, H, NB, NB]`` block scores -> causal bool mask.

    ``threshold >= 1`` selects every causal block: the cumulative rule alone would leave out
    blocks whose estimated mass underflows to 0 (peaked fp16 inputs), which is not dense."""
    nb = scores.shape[-1]
    if threshold >= 1:
        return block_causal(nb, scores.device).expand(scores.shape).clone()
    s = scores.double()
    r = torch.arange(nb, device=s.device)
    forced = (r[None, :] == 0) | (r[None, :] == r[:, None])
    required = s.sum(-1, keepdim=True) * threshold
    forced_mass = (s * forced).sum(-1, keepdim=True)
    vals, order = torch.sort(s.masked_fill(forced, -1.0), dim=-1, descending=True)
    pos = vals.clamp(min=0)
    before = forced_mass + torch.cumsum(pos, dim=-1) - pos
    take = (before < required) & (vals >= 0)
    sel = torch.zeros_like(take).scatter_(-1, order, take)
    return (sel | forced) & block_causal(nb, s.device)


def block_scores(q, k, *, block_size, stride, scale, norm, impl) -> torch.Tensor:
    if resolve_impl(impl, q.device) == "triton":
        from ..kernels.xattn_estimate import xattn_block_scores

        return xattn_block_scores(
            q, k, block_size=block_size, stride=stride, scale=scale, norm=norm
        )
    return antidiagonal_block_scores(
        q, k, block_size=block_size, stride=stride, scale=scale, norm=norm
    )


def xattn_plan(q, k, *, threshold, stride, block_size, norm, scale, impl) -> BlockPlan:
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = block_scores(
        q, k, block_size=block_size, stride=stride, scale=scale, norm=norm, impl=impl
    )
    return BlockPlan(select_blocks(scores, threshold), block_size)


def _check(*, threshold, stride, block_size, norm, scale, impl):
    check_fraction("threshold", threshold)
    check_positive_int("stride", stride)
    check_block_size(block_size)
    if block_size % stride:
        raise ValueError(f"block_size={block_size} must be a multiple of stride={stride}")
    norm = check_finite("norm", norm)
    if norm <= 0:
        raise ValueError(f"norm must be > 0, got {norm!r}")
    check_scale(scale)
    check_impl(impl)


XATTN = register_block_sparse(
    "xattn",
    xattn_plan,
    defaults=DEFAULTS,
    main_knob="threshold",
    check=_check,
    plan_takes_impl=True,
)
