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

**v2** (qhfan/FlashPrefillv2, read at commit 0f8e791) keeps the rule (scores summed over a
tile's rows against the tile's max, kept at ``>= alpha x`` the best, sink/local/dense tail) and
adds, all off here by default so that a default run is v1's:

6. **Mean correction** (``mean_correction=True``; v2's ``use_mean_correction``, default off in
   ``flashprefill_ops/flashprefill/prefill.py``). Every key block ``j`` that the tile did *not*
   keep and that lies wholly before the tile's first row (``(j+1)*block_size <= t*block_size``,
   i.e. ``j < t``) enters the tile's softmax as one extra logit ``scale * q_i . K̄[j] +
   log(len_j)`` whose value is ``V̄[j]``: ``len_j`` copies of the mean key and mean value
   (numerator ``len_j exp(scale q.K̄) V̄``, denominator ``len_j exp(scale q.K̄)``). Blocks on or
   after the tile's first row are never corrected (the diagonal band is left to the exact path;
   here the diagonal is always kept, ``local_blocks >= 1``). Every corrected block is whole
   (``j < t`` and ``t*block_size < L``), so ``len_j = block_size``; v2 also handles a short tail
   block (non-causal), which a causal prefill never corrects. ``K̄``/``V̄`` are fp32 block
   means stored in the input dtype (v2: ``_paged_k_mean_kernel`` in
   ``flashprefill_ops/flash_block_sparse_index_triton.py`` pools V beside K when the correction
   is on). Its semantics are spelled out by the fp64 reference in
   ``flashprefill_ops/test_mean_correction.py`` and run in the attention kernel's online
   softmax (``flashprefill_ops/mainloop_fwd_sm90_tma_gmma_ws.hpp``: one extra pass per chunk
   of pooled blocks, the unselected ones shifted by ``log2(len)``, the others masked, causal
   bound ``j_end = (prefix + q_pos_min) / block``). Here: :func:`mean_corrected_reference`
   (one softmax over the kept tokens and the corrected means, the specification) and, on the
   Triton path, the block-sparse kernel's output and row log-sum-exp merged in PyTorch with the
   corrections' (:func:`merge_mean_correction`; the same softmax, split in two and recombined).
   The tiles' density counts the kept blocks only: the correction reads one pooled key and
   value per pruned block (``1/block_size`` of that block's work). It runs in ``attend`` (the
   plan is the same with it on), so its time, pooling K and V included, is the attention's
   (``time_attention_ms``). Where a pruned block's tokens share one key and value the term is
   that block's exact contribution (the tests' exactness check).
7. **Dense tail.** v2's ``last_n_blocks`` counts the last *PackGQA* query tiles: 128 packed
   rows of one KV head, ``128 / G`` query positions x ``G`` heads (``_packgqa_score_select_kernel``,
   ``full_last_tile``); its library default is 2 (``prefill.py``, SGLang's
   ``--flashprefill-last-n-blocks``), its README's recipe 8. Our tiles are one query head's
   ``block_size`` rows, so v2's ``N`` tiles are the last ``ceil(N * 128 / G)`` positions or so:
   with ``G = 4`` (Llama-3.1-8B) v2's 8 are v1's 2 of ours (``dense_tail_tiles=2``, the
   default); with ``G = 1``, ``dense_tail_tiles=8``. The knob stays ``dense_tail_tiles`` in our
   tiles; pick it from that arithmetic.
8. **Dense first layers** (``dense_first_layers=N``; v2's SGLang ``--flashprefill-full-attention-
   layers``, default 0, README recipe 4: ``layer.layer_id < N`` runs the dense backend, in
   ``sglang_int/.../layers/attention/flashprefill_backend.py``). A layer choice, not a per-call
   rule: ``s2o.hf.sparse_prefill`` keeps the model's attention layers with index ``< N`` dense
   (their stats say why); a per-call use (operator runs) with ``N > 0`` is refused
   (``Method.layer_knobs``).

v2's README recipe is ``alpha`` 0.1, sink 2, local 4, 8 tail tiles, 4 dense first layers, the
correction on, ``min_sparse_q_len`` 0 (its SGLang default 4096 keeps shorter prompts dense). Not
taken from v2: GQA packing (decisions shared by one KV head's query heads) and its score mask (a
block counts for a row when its *first* token is visible, v1: when its last is).

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

import math

import torch

from ..stats import _cdiv
from ..validation import check_bool, check_finite, check_scale, resolve_impl
from .blocksparse import (
    BlockPlan,
    attend,
    block_causal,
    check_block_size,
    check_impl,
    grouped_scores,
    mean_pool_tokens,
    pad_len,
    plan_stats,
    rank_select,
    register_block_sparse,
    visible_keys,
)
from .launch_knob import to_launch

DEFAULTS = {
    "alpha": None,
    "block_size": 128,
    "sink_blocks": 2,
    "local_blocks": 4,
    "dense_tail_tiles": 2,
    "min_budget": 0,
    "scale": None,
    "impl": "auto",
    "mean_correction": False,
    "dense_first_layers": 0,
}
# v2's knobs (module docstring, steps 6 and 8): off by default and absent from
# conf/method/flashprefill.yaml, so a default run's config (and its record identity) is what it
# was before them; a run sets them with +method.mean_correction=true +method.dense_first_layers=4.
V2_KNOBS = ("mean_correction", "dense_first_layers")
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


def correction_blocks(mask: torch.Tensor) -> torch.Tensor:
    """Step 6's blocks: ``[B, H, NB, NB]`` kept mask -> bool, block ``j`` pruned for tile ``t``
    and wholly before the tile's first row (``j < t``)."""
    nb = mask.shape[-1]
    t = torch.arange(nb, device=mask.device)
    return ~mask & (t[None, :] < t[:, None])


def pooled_values(v: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[B, Hkv, L, D] -> [B, Hkv, NB, D]`` fp32 block means of V, rounded to ``v.dtype``."""
    return mean_pool_tokens(v, block_size).to(v.dtype).float()


def _mean_logits(q_rows, km, corr_rows, scale: float, block_size: int) -> torch.Tensor:
    """``scale q . K̄[j] + log(block_size)`` where ``corr_rows [B, Hq, R, NB]``, else ``-inf``."""
    s = grouped_scores(q_rows.float(), km, scale) + math.log(block_size)
    return s.masked_fill(~corr_rows, float("-inf"))


def _query_chunks(B: int, Hq: int, width: int, bs: int) -> int:
    """Query blocks per chunk so that a ``[B, Hq, rows, width]`` fp32 tensor stays ~256 MB."""
    return max(1, (1 << 26) // max(1, B * Hq * bs * width))


def mean_corrected_reference(q, k, v, plan: BlockPlan, scale: float | None) -> torch.Tensor:
    """Step 6's specification: block-sparse causal attention plus the mean correction, as one
    softmax per row over the kept tokens and the corrected blocks' mean logits (fp32).

    Args:
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]``; plan: a plain FlashPrefill plan.
    Returns:
        ``[B, Hq, L, D]`` in q's dtype.
    """
    B, Hq, L, D = q.shape
    bs = plan.block_size
    scale = D**-0.5 if scale is None else float(scale)
    km, vm = pooled_keys(k, bs), pooled_values(v, bs)  # [B, Hkv, NB, D]
    corr = correction_blocks(plan.mask)
    nb = plan.mask.shape[-1]
    out = torch.empty_like(q)
    chunk = _query_chunks(B, Hq, L + nb, bs)
    for r0 in range(0, nb, chunk):
        rows = torch.arange(r0 * bs, min((r0 + chunk) * bs, L), device=q.device)
        s_tok = grouped_scores(q[:, :, rows].float(), k.float(), scale)
        s_tok = s_tok.masked_fill(~visible_keys(plan, rows, L), float("-inf"))
        s_mean = _mean_logits(q[:, :, rows], km, corr[:, :, rows // bs], scale, bs)
        p = torch.softmax(torch.cat([s_tok, s_mean], -1), -1)
        o = _grouped_pv(p[..., :L], v.float()) + _grouped_pv(p[..., L:], vm)
        out[:, :, rows] = o.to(q.dtype)
    return out


def _grouped_pv(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[B, Hq, R, N] x [B, Hkv, N, D] -> [B, Hq, R, D]`` without repeating ``v``."""
    B, Hq, R, N = p.shape
    Hkv = v.shape[1]
    return (p.reshape(B, Hkv, (Hq // Hkv) * R, N) @ v).view(B, Hq, R, -1)


def merge_mean_correction(q, k, v, plan: BlockPlan, out, lse, scale: float) -> torch.Tensor:
    """Step 6 on the Triton path: the block-sparse kernel's ``out [B, Hq, L, D]`` (fp32) and row
    log-sum-exp ``lse [B, Hq, L]`` merged with the corrected blocks' softmax term (PyTorch, in
    chunks of query blocks); returns ``[B, Hq, L, D]`` in q's dtype. Equal to
    :func:`mean_corrected_reference` up to the order of fp32 sums."""
    B, Hq, L, D = q.shape
    bs = plan.block_size
    km, vm = pooled_keys(k, bs), pooled_values(v, bs)
    corr = correction_blocks(plan.mask)
    nb = plan.mask.shape[-1]
    res = torch.empty_like(q)
    chunk = _query_chunks(B, Hq, nb, bs)
    for r0 in range(0, nb, chunk):
        rows = torch.arange(r0 * bs, min((r0 + chunk) * bs, L), device=q.device)
        s_mean = _mean_logits(q[:, :, rows], km, corr[:, :, rows // bs], scale, bs)
        lse_c = torch.logsumexp(s_mean, -1)  # -inf where nothing is corrected
        o_c = _grouped_pv(torch.softmax(s_mean, -1).nan_to_num(0.0), vm)
        lse_s = lse[:, :, rows]  # finite: the diagonal block is always kept
        both = torch.logaddexp(lse_s, lse_c)
        o = out[:, :, rows] * torch.exp(lse_s - both)[..., None]
        res[:, :, rows] = (o + o_c * torch.exp(lse_c - both)[..., None]).to(q.dtype)
    return res


def flashprefill_attend(q, k, v, plan: BlockPlan, *, scale, impl, launch, mean_correction):
    """Steps 5-6: block-sparse attention, plus the mean correction when ``mean_correction``."""
    if not mean_correction:
        return attend(q, k, v, plan, scale=scale, impl=impl, launch=launch)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if resolve_impl(impl, q.device) == "reference":
        return mean_corrected_reference(q, k, v, plan, scale), plan_stats(plan, q.shape[2])
    from ..kernels.block_sparse import block_sparse_attention, mask_to_lists

    if plan.kv_idx is None:
        plan.kv_idx, plan.kv_count = mask_to_lists(plan.mask)
    B, Hq, L, D = q.shape
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((B, Hq, L), dtype=torch.float32, device=q.device)
    block_sparse_attention(
        q, k, v, plan.kv_idx, plan.kv_count, block_size=plan.block_size, scale=scale, out=out,
        lse=lse, launch=to_launch(launch),
    )  # fmt: skip
    return merge_mean_correction(q, k, v, plan, out, lse, scale), plan_stats(plan, L)


def _check_count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check(*, alpha, block_size, sink_blocks, local_blocks, dense_tail_tiles, min_budget, scale,
           impl, mean_correction, dense_first_layers):  # fmt: skip
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
    check_bool("mean_correction", mean_correction)
    _check_count("dense_first_layers", dense_first_layers, 0)


FLASHPREFILL = register_block_sparse(
    "flashprefill", flashprefill_plan, defaults=DEFAULTS, main_knob="alpha", check=_check,
    plan_takes_impl=True, sparsity_increases_with_knob=True, attend_fn=flashprefill_attend,
    attend_knobs=("mean_correction",), layer_knobs=("dense_first_layers",),
)  # fmt: skip
