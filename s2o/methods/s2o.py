"""S2O behind the method interface: ``estimate`` is Step 1, ``attend`` is Pass-1 + Pass-2.

This is S2O's one front door: :data:`DEFAULTS` defines its knobs once, :func:`_check` validates
them once (at ``bind``) and ``_estimate``/``_attend`` pick the implementation. The public
:func:`s2o.s2o_attention` is a thin alias of ``sparse_attention("s2o", ...)``.

``topk_ratio`` (default ``None``: off) is S2O's top-k mode, the paper's setting for the
comparison with block-sparse attention at matched sparsity (Appendix Fig. 5): each Pass-2 query
tile walks exactly the first ``ceil(topk_ratio * ranked tiles)`` key tiles of its ranked prefix,
with no early stop; Pass-1 stays dense. It replaces the stop rule rather than adding to it, so it
needs ``tau <= 0`` (``tau > 0`` with it is refused, naming both; ``stop_tile`` then changes
nothing). ``walk_budget`` still caps the walk.

``mean_correction`` (default False: off) is a named variant, not the paper's method
(:mod:`s2o.mean_correction`): the ranked keys a query tile's walk skipped enter its softmax
through the mean key and value of each ranked tile of ``block_n`` keys. Reference path only:
with ``impl`` resolving to ``'triton'`` it is refused (at ``bind`` for ``impl='triton'``, at the
call for ``impl='auto'`` on CUDA tensors), naming the knob and the impl. It is left out of
``conf/method/s2o.yaml`` (:data:`OPTIONAL_KNOBS`) so that a default run's config, and its run
id, stay what they were; ``+method.mean_correction=true`` sets it.

``step1_score_bits`` (default 32: the fp32 scores, the paper's ranking) is a named variant too
(:func:`s2o.reference.score_buckets`): 16 or 24 ranks each segment's keys by the top bits of
their scores, ties in ascending position, so the Triton path's Step 1 ranks with one CUB sort
(it needs ``step1_sort='cub'`` there); causal, without ``tail_rank``. Optional as well:
``+method.step1_score_bits=16``.
"""

from __future__ import annotations

from ..dense_tail import check_dense_tail, tail_last
from ..mean_correction import check_mean_correction, refuse_on_triton
from ..reference import SCORE_BITS, s2o_permutations, s2o_reference, s2o_visible_keys
from ..stats import check_topk_ratio, refuse_topk_with_early_stop
from ..tail_rank import check_tail_rank
from ..validation import (
    IMPLS,
    check_choice,
    check_finite,
    check_positive_int,
    check_scale,
    check_tile,
    resolve_impl,
)
from .launch_knob import check_per_kernel, to_launch
from .registry import Method, register

DEFAULTS = {
    "segment_len": 2048,
    "tau": 0.005,
    "block_m": 128,
    "block_n": 128,
    "local_window": 0,
    "q_perm": None,
    "variant": "two_pass",
    "scale": None,
    "impl": "auto",
    "stop_tile": "keep",
    "walk_budget": None,
    "step1_sort": "chunks",
    "causal": True,
    "launch": None,
    "topk_ratio": None,
    "dense_tail": 0,
    "tail_rank": 0,
    "mean_correction": False,
    "step1_score_bits": 32,
}
# Off by default and absent from conf/method/s2o.yaml, so a default run's config (and its record
# identity) is what it was before them; a run sets them with +method.mean_correction=true.
OPTIONAL_KNOBS = ("mean_correction", "step1_score_bits")
# S2O's named variants (departures from the paper's text, off by default), each knob with the value
# that turns it off: a run with any of them on is a variant's result, not the paper's method's
NAMED_VARIANTS = {"dense_tail": 0, "tail_rank": 0, "mean_correction": False, "step1_score_bits": 32}


def variants_on(knobs: dict) -> dict:
    """The named variants that ``knobs`` turn on (:data:`NAMED_VARIANTS`), with their values;
    empty: the paper's method."""
    return {k: knobs[k] for k, off in NAMED_VARIANTS.items() if knobs.get(k, off) != off}


LAUNCH_KERNELS = ("pass1", "pass2", "fused")


VARIANTS = ("two_pass", "fused")
STOP_TILES = ("keep", "discard")


def effective_q_perm(q_perm: bool | None, variant: str) -> bool:
    """``q_perm=None`` means True for ``variant="two_pass"`` and False for ``"fused"``."""
    return variant == "two_pass" if q_perm is None else q_perm


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
        return effective_q_perm(q_perm, variant)
    if q_perm and variant == "fused":
        raise ValueError("variant='fused' does not reorder queries: q_perm=True is not supported")
    if not isinstance(q_perm, bool):
        raise ValueError(f"q_perm must be a bool or None, got {q_perm!r}")
    return q_perm


def _check_sort(step1_sort, impl: str) -> None:
    """``step1_sort='cub'`` (CUB radix sorts) exists only on the Triton path: asked for on the
    reference path (``impl``, resolved or explicit, ``'reference'``), it is refused, not ignored."""
    if step1_sort == "cub" and impl == "reference":
        raise ValueError(
            "step1_sort='cub' picks the Triton path's Step-1 sort (CUB radix sorts), but impl "
            "resolves to 'reference' (impl='reference', or impl='auto' with CPU tensors), whose "
            "Step 1 has one sort of its own: use impl='triton' (CUDA tensors, or "
            "TRITON_INTERPRET=1), or step1_sort='chunks'"
        )


def _check_score_bits(bits, *, impl, step1_sort, causal, tail_rank) -> None:
    """``step1_score_bits``: one of :data:`~s2o.reference.SCORE_BITS`; below 32, causal without
    ``tail_rank``, and on the Triton path (``impl='triton'``) with ``step1_sort='cub'``."""
    if isinstance(bits, bool) or bits not in SCORE_BITS:
        raise ValueError(f"step1_score_bits must be one of {SCORE_BITS}, got {bits!r}")
    if bits < 32 and (not causal or tail_rank):
        raise ValueError(f"step1_score_bits={bits} ranks a causal prefix: it needs causal=True "
                         f"(got {causal}) and tail_rank=0 (got {tail_rank})")  # fmt: skip
    if bits < 32 and impl == "triton" and step1_sort != "cub":
        raise ValueError(f"step1_score_bits={bits} ranks with one CUB sort on the Triton path: "
                         f"it needs step1_sort='cub', got {step1_sort!r}")  # fmt: skip


def _check(*, impl, step1_sort, causal, launch, topk_ratio, dense_tail, tail_rank,
           mean_correction, step1_score_bits, **knobs):  # fmt: skip
    check_per_kernel(launch, LAUNCH_KERNELS)
    check_choice("impl", impl, IMPLS)
    check_mean_correction(mean_correction, impl=impl)
    check_choice("step1_sort", step1_sort, ("chunks", "full", "cub"))
    _check_sort(step1_sort, impl)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    check_s2o_args(**knobs)
    refuse_topk_with_early_stop(check_topk_ratio(topk_ratio), knobs["tau"])
    check_dense_tail(dense_tail, topk_ratio=topk_ratio, walk_budget=knobs["walk_budget"],
                     causal=causal)  # fmt: skip
    check_tail_rank(tail_rank, dense_tail=dense_tail, causal=causal)
    _check_score_bits(step1_score_bits, impl=impl, step1_sort=step1_sort, causal=causal,
                      tail_rank=tail_rank)  # fmt: skip


def _estimate(q, k, v, *, segment_len, local_window, impl, step1_sort, causal, dense_tail,
              tail_rank, mean_correction, step1_score_bits, **_):  # fmt: skip
    """Step 1; ``step1_sort`` picks the Triton path's sort (the reference has one: ``'cub'``
    is refused there). ``dense_tail`` moves the last rows out of ``Q_perm``'s order;
    ``tail_rank`` does too and adds the tail's own rows to ``KV_perm``. ``mean_correction``
    on the Triton path is refused here, before Step 1 runs. ``step1_score_bits`` < 32 ranks by
    the scores' top bits (the Triton path: with ``step1_sort='cub'``)."""
    path = resolve_impl(impl, q.device)
    refuse_on_triton(mean_correction, path)
    if path == "reference":
        _check_sort(step1_sort, "reference")
        return s2o_permutations(q, k, segment_len, local_window, causal, dense_tail, tail_rank,
                                score_bits=step1_score_bits)  # fmt: skip
    from ..kernels import WALK_INDEX_DTYPE, s2o_step1

    q_perm, kv_perm = s2o_step1(
        q, k, segment_len=segment_len, local_window=local_window, sort_mode=step1_sort,
        causal=causal, tail_rank=tail_rank, index_dtype=WALK_INDEX_DTYPE,
        score_bits=step1_score_bits,
    )  # fmt: skip
    return tail_last(q_perm, segment_len, dense_tail), kv_perm


def _prepare(*, variant, q_perm, tau, step1_sort, impl, causal, launch, topk_ratio, dense_tail,
             tail_rank, **knobs):  # fmt: skip
    """Knobs as ``attend`` takes them (already validated by ``_check``): the effective
    ``q_perm``, a float tau and topk_ratio."""
    return dict(
        knobs, variant=variant, q_perm=effective_q_perm(q_perm, variant), tau=float(tau),
        step1_sort=step1_sort, impl=impl, causal=causal, launch=launch,
        topk_ratio=check_topk_ratio(topk_ratio), dense_tail=dense_tail, tail_rank=tail_rank,
    )  # fmt: skip


def _attend(q, k, v, perms, *, impl, variant, q_perm, step1_sort, launch, mean_correction,
            step1_score_bits, **knobs):  # fmt: skip
    """Pass-1 + Pass-2; the knobs come from ``_prepare`` (``q_perm`` already resolved; the
    Step-1 knobs ``step1_sort`` and ``step1_score_bits`` were used by ``_estimate``).
    ``mean_correction`` runs on the reference path only (refused on the Triton path)."""
    if resolve_impl(impl, q.device) == "reference":
        return s2o_reference(q, k, v, q_perm=q_perm, perms=perms,
                             mean_correction=mean_correction, **knobs)  # fmt: skip
    refuse_on_triton(mean_correction, "triton")
    from ..kernels import s2o_triton

    settings = None if launch is None else {k_: to_launch(v_) for k_, v_ in launch.items()}
    return s2o_triton(
        q, k, v, variant=variant, q_perm=q_perm, perms=perms, launch=settings, **knobs
    )


S2O = register(
    Method(
        name="s2o",
        estimate=_estimate,
        attend=_attend,
        defaults=DEFAULTS,
        main_knob="tau",
        sparsity_increases_with_knob=True,
        check=_check,
        prepare=_prepare,
        optional_knobs=OPTIONAL_KNOBS,
        coverage=lambda plan, stats, rows, seq_len, **knobs: s2o_visible_keys(
            plan, stats.extra["pass2_tiles"], rows, seq_len, **knobs
        ),
    )
)
