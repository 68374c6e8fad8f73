"""PBS-Attn, permuted block-sparse attention (Wang et al., arXiv 2510.21270), behind the method
interface.

Follows ``permuted_block_sparse_attn_fwd`` of the official code (xinghaow99/pbs-attn,
``pbs_attn/src/pbs.py``, ``permute_states.py``, ``utils.py``, ``kernels/...``):

1. **Key importance.** ``imp = mean_rows(softmax(scale * q[-bs:] K_c^T))`` (fp32, no causal mask)
   over the keys ``K_c`` of the complete segments (first ``floor(L/seg)*seg`` tokens).
2. **Permutation.** Inside each complete segment, keys sorted by descending importance; the
   remainder (``L mod seg``) stays in place; no permutation when there is no complete segment or
   exactly one and no remainder. Queries are not permuted (the released code's choice).
3. **Block scores.** Zero-pad Q and the permuted K to a multiple of ``bs``; pool each block
   (``mean`` divides by ``bs`` including the padding, ``max`` includes the zeros);
   ``softmax(scale * Qbar Kbar^T)`` over key blocks with a block-causal mask that also excludes
   the query's own segment; all-masked rows give zeros.
4. **Selection.** Per row, sorted descending, keep blocks up to and including the first one whose
   cumulative score reaches ``threshold`` (nothing if it is never reached); force the permuted
   block that holds token 0; keep only blocks before the own segment.
5. **Attention.** Selected permuted blocks (keys gathered by index) plus the whole own segment,
   causal by original index.

Differences from the official code:

* Official: ``Hq == Hkv`` (the HF patch repeats K/V), gathers full permuted copies of K and V, a
  Triton kernel that scans a bool mask of every key block of the prefix, ``argsort`` not stable.
  Here: native GQA (a per-query-head permutation indexes the shared K/V head), no copies, a list
  of selected blocks, a stable sort (ties keep the lower index).
* The own segment is computed in original key order (the official kernel walks it in permuted
  order with a token-level mask): the same keys, so the same result; its causal tiles count
  (``r - segment_start + 1`` per query block), not the tile above the diagonal the official
  kernel also visits.
* Pooled scores in fp32 (official: einsum in the input dtype). ``threshold >= 1`` keeps every
  off-segment causal block (official: only the integer ``1`` does; a float ``1.0`` may select
  nothing when the fp32 cumulative sum falls short of 1).
* ``scale`` (default ``1/sqrt(D)``) also scales the estimate (official: always ``1/sqrt(D)``).
"""

from __future__ import annotations

import torch

from ..stats import _cdiv
from ..validation import check_choice, check_positive_int, check_scale
from .blocksparse import (
    BlockPlan,
    block_causal,
    check_block_size,
    check_fraction,
    check_impl,
    grouped_scores,
    pad_len,
    register_block_sparse,
)

DEFAULTS = {
    "threshold": 0.9,
    "block_size": 128,
    "segment_size": 256,
    "force_first_block": True,
    "query_pool": "mean",
    "key_pool": "mean",
    "scale": None,
    "impl": "auto",
}
POOLS = ("mean", "max")


def key_permutation(q, k, *, block_size, segment_size, scale) -> torch.Tensor:
    """Steps 1-2 -> ``[B, Hq, L]`` int64, permuted position -> original token."""
    B, Hq, L, _ = q.shape
    nseg, seg = L // segment_size, segment_size
    ident = torch.arange(L, device=q.device).expand(B, Hq, L)
    if nseg == 0 or (nseg == 1 and L == seg):
        return ident.clone()
    lc = nseg * seg
    probs = torch.softmax(grouped_scores(q[:, :, -block_size:], k[:, :, :lc], scale), dim=-1)
    imp = probs.mean(-2).view(B, Hq, nseg, seg)
    order = torch.argsort(imp, dim=-1, descending=True, stable=True)
    order = order + torch.arange(0, lc, seg, device=q.device)[:, None]
    return torch.cat([order.view(B, Hq, lc), ident[..., lc:]], dim=-1)


def gather_keys(k: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``k [B, Hkv, L, D]``, ``perm [B, Hq, L]`` -> ``[B, Hq, L, D]`` keys in each head's order."""
    B, Hkv, L, D = k.shape
    Hq = perm.shape[1]
    heads = torch.arange(Hq, device=k.device) // (Hq // Hkv)
    base = (torch.arange(B, device=k.device)[:, None] * Hkv + heads[None, :]) * L
    return k.reshape(B * Hkv * L, D)[(base[..., None] + perm).reshape(-1)].view(B, Hq, L, D)


def pool_blocks(x: torch.Tensor, block_size: int, mode: str) -> torch.Tensor:
    """Official pooling on zero-padded blocks -> ``[B, H, NB, D]`` fp32."""
    nb = _cdiv(x.shape[2], block_size)
    xb = pad_len(x.float(), nb * block_size).view(*x.shape[:2], nb, block_size, x.shape[3])
    return xb.mean(3) if mode == "mean" else xb.amax(3)


def select_cumulative(p: torch.Tensor, threshold: float) -> torch.Tensor:
    """Official ``select_blocks``: per row the shortest descending prefix reaching ``threshold``."""
    vals, order = torch.sort(p, dim=-1, descending=True)
    reach = torch.cumsum(vals, dim=-1) >= threshold
    first = torch.argmax(reach.int(), dim=-1, keepdim=True)
    ramp = torch.arange(p.shape[-1], device=p.device)
    keep = (ramp <= first) & reach.any(-1, keepdim=True)
    return torch.zeros_like(keep).scatter_(-1, order, keep)


def pbs_plan(
    q, k, *, threshold, block_size, segment_size, force_first_block, query_pool, key_pool, scale
) -> BlockPlan:
    """The PBS plan (module docstring, steps 1-4)."""
    B, Hq, L, _ = q.shape
    bs = block_size
    nb = _cdiv(L, bs)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    perm = key_permutation(q, k, block_size=bs, segment_size=segment_size, scale=scale)
    kbar = pool_blocks(gather_keys(k, perm), bs, key_pool)
    qbar = pool_blocks(q, bs, query_pool)
    s = (qbar @ kbar.transpose(-1, -2)) * scale
    seg_of = torch.arange(nb, device=q.device) // (segment_size // bs)
    allowed = block_causal(nb, q.device) & (seg_of[:, None] != seg_of[None, :])
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    if threshold >= 1:
        sel = allowed.expand(B, Hq, nb, nb).clone()
    else:
        sel = select_cumulative(p, threshold)
    if force_first_block:
        first = (perm == 0).int().argmax(-1) // bs  # [B, Hq] permuted block of token 0
        sel |= (torch.arange(nb, device=q.device) == first[..., None])[:, :, None, :]
    return BlockPlan(sel & allowed, bs, key_perm=perm.int(), segment_size=segment_size)


def _check(
    *, threshold, block_size, segment_size, force_first_block, query_pool, key_pool, scale, impl
):
    check_fraction("threshold", threshold)
    check_block_size(block_size)
    check_positive_int("segment_size", segment_size)
    if segment_size % block_size:
        raise ValueError(
            f"segment_size={segment_size} must be a multiple of block_size={block_size}"
        )
    if not isinstance(force_first_block, bool):
        raise ValueError(f"force_first_block must be a bool, got {force_first_block!r}")
    check_choice("query_pool", query_pool, POOLS)
    check_choice("key_pool", key_pool, POOLS)
    check_scale(scale)
    check_impl(impl)


PBS = register_block_sparse("pbs", pbs_plan, defaults=DEFAULTS, main_knob="threshold", check=_check)
