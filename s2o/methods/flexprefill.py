"""FlexPrefill (Lai et al., ICLR 2025) behind the method interface.

Follows ``get_active_blocks`` / ``flex_prefill_attention`` of the official code
(bytedance/FlexPrefill, ``flex_prefill/ops/flex_prefill_attention.py``), batched over heads:

1. **Last-block attention.** ``A = softmax(scale * q[-bs:] K^T)`` (fp32) for the last ``bs``
   queries, causal only inside the last ``bs x bs`` corner. ``vertical = mean_rows(A)``;
   ``slash[j] = (1/bs) * sum of A along the diagonal at query-key distance ``L-1-j``.
2. **Budgets.** ``n = cover(x, gamma) // 128 + 1`` blocks, where ``cover`` counts the largest token
   scores whose cumulative sum stays ``<= gamma`` plus one; the ``128`` is hard-coded in the
   official code (not ``block_size``) and kept here. Clamped to
   ``[ceil(min_budget/bs), min(ceil(max_budget/bs), NB)]``.
3. **Pattern decision.** ``est = softmax(scale * mean(q[-bs:]) . blockmean(K)^T)`` vs the
   block-summed ``vertical``; heads with ``sqrt(JSD) < tau`` are *query-aware* and get
   ``n_v = n_s = min_budget`` blocks. The official formula ``p * log(p / m)`` is kept, so a zero
   probability gives NaN and the head counts as vertical-slash (as in the official code).
4. **Vertical-slash blocks.** Key block 0 and the diagonal are forced; the ``n_v`` best key
   blocks by block-summed ``vertical`` give columns ``(r, c), r >= c``; the ``n_s`` best slash
   blocks (index ``j`` -> block offset ``NB-1-j``) give diagonals ``(r + o, r)``.
5. **Query-aware heads.** ``softmax(scale * blockmean(Q) . blockmean(K)^T)`` with a block-causal
   mask; the entries of the whole ``NB x NB`` map, sorted descending, whose *global* cumulative sum
   stays ``<= gamma * NB`` are added.
6. **Short inputs.** ``L <= max(2*bs, ceil(min_budget/bs)*bs)``: dense causal attention.

Differences from the official code (none changes a decision on well-separated scores):

* Official: bf16 only, batch 1, ``gqa_interleave`` option, per-head Python loops, ``.item()``
  syncs and ``torch.unique``. Here: any batch, fp16/bf16/fp32, the project's GQA mapping
  ``h // (Hq/Hkv)`` (the official default ``gqa_interleave=False``), no loops or syncs: top-k is a
  stable descending sort (ties go to the lower index) and the blocks are built as a boolean mask.
* Pooled query/key means and the block scores are computed in fp32 (official: bf16), and ``q`` is
  scaled after the product instead of before it.
* ``scale`` (default ``1/sqrt(D)``) is used by the estimate as well as the attention (official:
  the estimate always uses ``1/sqrt(D)``); identical at the default.
"""

from __future__ import annotations

import torch

from ..stats import _cdiv
from ..validation import check_finite, check_positive_int, check_scale
from .blocksparse import (
    BlockPlan,
    block_causal,
    check_block_size,
    check_fraction,
    check_impl,
    grouped_scores,
    mean_pool_tokens,
    rank_select,
    register_block_sparse,
)

DEFAULTS = {
    "gamma": 0.9,
    "tau": 0.1,
    "min_budget": 1024,
    "max_budget": None,
    "block_size": 128,
    "scale": None,
    "impl": "auto",
}
OFFICIAL_BUDGET_DIVISOR = 128  # the `// 128` of the official budget formula


def _scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def last_block_probs(q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float):
    """``[B, Hq, bs, L]`` fp32 softmax of the last ``bs`` queries, causal in the last corner."""
    L = q.shape[2]
    s = grouped_scores(q[:, :, -block_size:], k, scale)
    i = torch.arange(block_size, device=q.device)
    corner = i[None, :] > i[:, None]
    s[..., L - block_size :] = s[..., L - block_size :].masked_fill(corner, float("-inf"))
    return torch.softmax(s, dim=-1)


def vertical_slash_scores(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``probs [B, H, n, L]`` -> ``(vertical, slash)`` each ``[B, H, L]``.

    ``slash[j]`` averages the diagonal at distance ``L-1-j`` (row ``i`` = query ``L-n+i``).
    """
    B, H, n, L = probs.shape
    padded = torch.nn.functional.pad(probs, (n - 1, 0))  # [B, H, n, L + n - 1]
    w = L + n - 1
    diag = padded.as_strided((B, H, L, n), (H * n * w, n * w, 1, w + 1))
    return probs.mean(-2), diag.sum(-1) / n


def cover_count(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """Official ``score_cover_topk``: #largest entries with cumulative sum ``<= gamma``, plus 1."""
    c = torch.cumsum(torch.sort(x, dim=-1, descending=True).values, dim=-1)
    return (c <= gamma).sum(-1) + 1


def sum_pool(x: torch.Tensor, block: int) -> torch.Tensor:
    """``[B, H, L] -> [B, H, NB]`` sums over blocks (zero padding)."""
    nb = _cdiv(x.shape[-1], block)
    return (
        torch.nn.functional.pad(x, (0, nb * block - x.shape[-1]))
        .view(*x.shape[:-1], nb, block)
        .sum(-1)
    )


def sqrt_js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The official formula (NaN where a probability is 0)."""
    m = (p + q) / 2
    return torch.sqrt(0.5 * (p * torch.log(p / m)).sum(-1) + 0.5 * (q * torch.log(q / m)).sum(-1))


def budgets(vertical, slash, *, gamma, min_blocks, max_blocks):
    """Official budget rule -> ``(n_v, n_s)`` ``[B, H]`` in blocks."""
    out = []
    for x in (vertical, slash):
        n = cover_count(x, gamma) // OFFICIAL_BUDGET_DIVISOR + 1
        n = torch.where(n < min_blocks, min_blocks, n)
        out.append(torch.where(n > max_blocks, max_blocks, n))
    return out[0], out[1]


def vertical_slash_mask(v_blk, s_blk, n_v, n_s) -> torch.Tensor:
    """Vertical/slash blocks with forced sink column and diagonal -> ``[B, H, NB, NB]``."""
    nb = v_blk.shape[-1]
    v_blk, s_blk = v_blk.clone(), s_blk.clone()
    v_blk[..., 0] = torch.inf
    s_blk[..., -1] = torch.inf
    vsel = rank_select(v_blk, n_v)  # [B, H, NB] columns
    soff = rank_select(s_blk, n_s).flip(-1)  # [B, H, NB] by offset o = NB-1-j
    r = torch.arange(nb, device=v_blk.device)
    off = (r[:, None] - r[None, :]).clamp(min=0)
    return block_causal(nb, v_blk.device) & (vsel[..., None, :] | soff[..., off])


def query_aware_mask(q, k, *, block_size, gamma, scale) -> torch.Tensor:
    """Official block-sparse branch for every head: ``[B, H, NB, NB]`` (global cumulative cut)."""
    nb = _cdiv(q.shape[2], block_size)
    s = grouped_scores(mean_pool_tokens(q, block_size), mean_pool_tokens(k, block_size), scale)
    causal = block_causal(nb, q.device)
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1).flatten(-2)
    vals, order = torch.sort(p, dim=-1, descending=True)
    keep = torch.cumsum(vals, dim=-1) <= gamma * nb
    sel = torch.zeros_like(keep).scatter_(-1, order, keep)
    return sel.view(*s.shape) & causal


def flexprefill_plan(q, k, *, gamma, tau, min_budget, max_budget, block_size, scale) -> BlockPlan:
    """The FlexPrefill block mask (module docstring, steps 1-6)."""
    B, Hq, L, D = q.shape
    bs = block_size
    nb = _cdiv(L, bs)
    scale = _scale(q, scale)
    min_tokens = 1 if min_budget is None else min_budget
    max_tokens = 2**31 - 1 if max_budget is None else max_budget
    if L <= max(2 * bs, _cdiv(min_tokens, bs) * bs):
        mask = block_causal(nb, q.device).expand(B, Hq, nb, nb).clone()
        return BlockPlan(mask, bs, extra={"dense_fallback": True})
    min_blocks, max_blocks = _cdiv(min_tokens, bs), min(_cdiv(max_tokens, bs), nb)
    probs = last_block_probs(q, k, bs, scale)
    vertical, slash = vertical_slash_scores(probs)
    del probs
    n_v, n_s = budgets(vertical, slash, gamma=gamma, min_blocks=min_blocks, max_blocks=max_blocks)
    v_blk, s_blk = sum_pool(vertical, bs), sum_pool(slash, bs)
    avg_k = mean_pool_tokens(k, bs)
    est = torch.softmax(
        grouped_scores(q[:, :, -bs:].float().mean(2, keepdim=True), avg_k, scale), -1
    )
    js = sqrt_js_divergence(est.squeeze(2), v_blk)
    query_aware = js < tau
    n_v = torch.where(query_aware, min_blocks, n_v)
    n_s = torch.where(query_aware, min_blocks, n_s)
    mask = vertical_slash_mask(v_blk, s_blk, n_v, n_s)
    qa = query_aware_mask(q, k, block_size=bs, gamma=gamma, scale=scale)
    mask |= qa & query_aware[..., None, None]
    extra = {"query_aware": query_aware, "n_vertical": n_v, "n_slash": n_s, "js": js}
    return BlockPlan(mask, bs, extra=extra)


def _check(*, gamma, tau, min_budget, max_budget, block_size, scale, impl):
    check_fraction("gamma", gamma)
    tau = check_finite("tau", tau)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau!r}")
    for name, val in (("min_budget", min_budget), ("max_budget", max_budget)):
        if val is not None:
            check_positive_int(name, val)
    check_block_size(block_size)
    check_scale(scale)
    check_impl(impl)


FLEXPREFILL = register_block_sparse(
    "flexprefill", flexprefill_plan, defaults=DEFAULTS, main_knob="gamma", check=_check
)
