"""FlashPrefill (Fan et al., 2026) behind the method interface.

Follows ``FlashPrefill.forward`` of the official v1 code (qhfan/FlashPrefill,
``ops/flashprefill_native_forward.py``: ``compute_mean_vector``, ``compute_block_score``,
``normalize_scores``, ``deal_output_score``), per batch and query head:

1. **Pooled keys.** ``K̄[j]`` = the mean of key block ``j`` (``block_size`` tokens; a short last
   block averages its own tokens), per KV head, rounded to the input dtype as the official code
   stores it.
2. **Tile scores.** Query tile ``t`` (``block_size`` rows, zero rows past ``L``) against every
   pooled key block ``j`` with ``i >= (j+1)*block_size - 1`` for row ``i`` (the block ends at or
   before the row): logits ``s[i, j] = scale * q_i . K̄[j]``. With ``M_t`` the maximum over the
   whole tile (all its rows and visible blocks), ``score[t, j] = sum_i exp(s[i, j] - M_t)``, then
   divided by ``sum_j score[t, j] + 1e-9``. So the diagonal block is scored by the tile's last
   row alone, and in the last tile the zero rows past ``L`` count (logit 0).
3. **Threshold.** Block ``j`` is kept for tile ``t`` when ``score[t, j] >= alpha * max_j
   score[t, j]``. ``min_budget > 0``: also the ``min_budget`` best blocks of the row (blocks,
   not tokens; clamped to ``NB``).
4. **Forced blocks.** The first ``sink_blocks`` key blocks, the ``local_blocks`` nearest ones
   (``0 <= t - j < local_blocks``: the diagonal and ``local_blocks - 1`` before it), and every
   block of the last ``dense_tail_tiles`` query tiles. Everything above the diagonal is dropped.
5. Block-sparse causal attention with that mask (causal masking on the diagonal block only).

Defaults are the official ones (``block_size`` 128, 2 sink blocks, 4 local blocks, 2 dense tail
tiles, ``min_budget`` 0). ``alpha`` has no default: the official configs set it per model family
(:data:`OFFICIAL_ALPHA`); ``conf/method/flashprefill.yaml`` takes it from the model's config
(``model.arch.model_type``) and 0.18 (Llama-3.1-8B) without a model.

v2 (qhfan/FlashPrefillv2) keeps this rule. Its recipe of 8 dense tail tiles is
``dense_tail_tiles=8``; its other changes are not here: the mean correction (each pruned, fully
visible block enters the softmax through ``len_j * exp(scale q . K̄[j])`` and ``V̄[j]``) needs the
attention kernel's softmax state, and its 4 dense first layers are a layer selection
(``s2o.hf.sparse_prefill(..., layers=...)``), which a per-call method does not see.

Differences from the official code:

* Official: bf16, ``q, k, v`` as ``[B, L, H, D]``, autotuned Triton kernels, ``torch.compile``d
  selection, its own sparse-attention kernel. Here: fp16/bf16/fp32, ``[B, H, L, D]``, one
  scoring kernel (:mod:`s2o.kernels.flashprefill_select`) and the shared block-sparse kernel.
* Logits in natural-exp units (official: ``exp2`` of logits scaled by ``log2 e``); the same
  numbers up to rounding.
* ``scale`` (default ``1/sqrt(D)``) scales the scores and the attention (v1: always
  ``1/sqrt(D)``; v2: the model's softmax scale, as here); identical at the default.
* ``min_budget``: ties among equal scores go to the lower block index (official: ``torch.topk``'s
  order); the official code fails for ``min_budget > NB``, here it is clamped.
* GQA: each query head is its own tile, as in v1 (v2 packs the group's rows of one KV head into
  one 128-row tile, so its decisions are shared per KV head).
"""

from __future__ import annotations

import torch

from ..api import resolve_impl
from ..stats import _cdiv
from ..validation import check_finite, check_scale
from .blocksparse import (
    BlockPlan,
    block_causal,
    check_block_size,
    check_impl,
    grouped_scores,
    mean_pool_tokens,
    pad_len,
    rank_select,
    register_block_sparse,
)

DEFAULTS = {
    "alpha": None,
    "block_size": 128,
    "sink_blocks": 2,
    "local_blocks": 4,
    "dense_tail_tiles": 2,
    "min_budget": 0,
    "scale": None,
    "impl": "auto",
}
# The official configs' alpha by transformers ``model_type`` (ruler/models/*.py and the vLLM
# patch: Llama-3.1-8B, Qwen2/Qwen2.5, Qwen3-MoE). No value is published for other families.
OFFICIAL_ALPHA = {"llama": 0.18, "qwen2": 0.08, "qwen3_moe": 0.12}
NORM_EPS = 1e-9  # the official normalize_scores' denominator guard


def official_alpha(model_type: str) -> float:
    """The official alpha for a model family; ``ValueError`` for a family without one."""
    if model_type not in OFFICIAL_ALPHA:
        raise ValueError(
            f"FlashPrefill publishes no alpha for model_type={model_type!r} (official: "
            f"{OFFICIAL_ALPHA}); give alpha explicitly"
        )
    return OFFICIAL_ALPHA[model_type]


def pooled_keys(k: torch.Tensor, block_size: int) -> torch.Tensor:
    """Step 1: ``[B, Hkv, L, D] -> [B, Hkv, NB, D]`` fp32 block means, rounded to ``k.dtype``."""
    return mean_pool_tokens(k, block_size).to(k.dtype).float()


def tile_scores(q: torch.Tensor, k: torch.Tensor, *, block_size: int, scale: float):
    """Step 2 -> ``[B, Hq, NB, NB]`` fp32 normalized scores (0 where a block is not scored)."""
    B, Hq, L, D = q.shape
    bs = block_size
    nb = _cdiv(L, bs)
    s = grouped_scores(pad_len(q.float(), nb * bs), pooled_keys(k, bs), scale)  # [B,Hq,nb*bs,nb]
    rows = torch.arange(nb * bs, device=q.device)
    ends = (torch.arange(nb, device=q.device) + 1) * bs - 1
    s = s.masked_fill(rows[:, None] < ends[None, :], float("-inf")).view(B, Hq, nb, bs, nb)
    m = s.amax(dim=(3, 4), keepdim=True)  # finite: the tile's last row sees block 0
    score = torch.exp(s - m).sum(3)
    return score / (score.sum(-1, keepdim=True) + NORM_EPS)


def select(scores: torch.Tensor, *, alpha, sink_blocks, local_blocks, dense_tail_tiles,
           min_budget) -> torch.Tensor:  # fmt: skip
    """Steps 3-4 on ``[B, H, NB, NB]`` normalized scores -> causal bool mask."""
    nb = scores.shape[-1]
    keep = scores >= alpha * scores.amax(-1, keepdim=True)
    if min_budget > 0:
        n = torch.full(scores.shape[:-1], min(min_budget, nb), device=scores.device)
        keep |= rank_select(scores, n)
    return keep | forced_blocks(nb, sink_blocks, local_blocks, dense_tail_tiles, scores.device)


def forced_blocks(nb, sink_blocks, local_blocks, dense_tail_tiles, device) -> torch.Tensor:
    """``[NB, NB]`` bool: sink, local and dense-tail blocks, causal."""
    t = torch.arange(nb, device=device)
    dist = t[:, None] - t[None, :]
    forced = (
        (t[None, :] < sink_blocks) | (dist < local_blocks) | (t[:, None] >= nb - dense_tail_tiles)
    )
    return forced & block_causal(nb, device)


def flashprefill_plan(
    q, k, *, alpha, block_size, sink_blocks, local_blocks, dense_tail_tiles, min_budget, scale,
    impl="reference",
) -> BlockPlan:  # fmt: skip
    """The FlashPrefill block mask (module docstring, steps 1-4) on the reference or Triton path."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    rule = dict(alpha=alpha, sink_blocks=sink_blocks, local_blocks=local_blocks,
                dense_tail_tiles=dense_tail_tiles)  # fmt: skip
    if resolve_impl(impl, q.device) == "triton":
        from ..kernels.flashprefill_select import flashprefill_select

        mask, scores = flashprefill_select(q, k, block_size=block_size, scale=scale, **rule)
        if min_budget > 0:
            n = torch.full(scores.shape[:-1], min(min_budget, scores.shape[-1]), device=q.device)
            mask |= rank_select(scores, n) & block_causal(scores.shape[-1], q.device)
    else:
        scores = tile_scores(q, k, block_size=block_size, scale=scale)
        mask = select(scores, min_budget=min_budget, **rule) & block_causal(
            scores.shape[-1], q.device
        )
    return BlockPlan(mask, block_size)


def _check_count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check(*, alpha, block_size, sink_blocks, local_blocks, dense_tail_tiles, min_budget, scale,
           impl):  # fmt: skip
    if alpha is None:
        raise ValueError(
            f"alpha is required (no default): the official configs set it per model family, "
            f"{OFFICIAL_ALPHA}; conf/method/flashprefill.yaml picks it by model.arch.model_type"
        )
    alpha = check_finite("alpha", alpha)
    if not 0 <= alpha <= 1:
        raise ValueError(
            f"alpha must be in [0, 1] (a fraction of the row's best score), got {alpha!r}"
        )
    check_block_size(block_size)
    _check_count("sink_blocks", sink_blocks, 0)
    _check_count("local_blocks", local_blocks, 1)  # the diagonal block is always computed
    _check_count("dense_tail_tiles", dense_tail_tiles, 0)
    _check_count("min_budget", min_budget, 0)
    check_scale(scale)
    check_impl(impl)


FLASHPREFILL = register_block_sparse(
    "flashprefill", flashprefill_plan, defaults=DEFAULTS, main_knob="alpha", check=_check,
    plan_takes_impl=True, sparsity_increases_with_knob=True,
)  # fmt: skip
