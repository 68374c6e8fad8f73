"""FlashPrefill's Triton selection (pooling + scoring + threshold) vs the plain-PyTorch reference
under TRITON_INTERPRET=1 (tiny shapes, fp16/fp32: the interpreter's bf16 tl.dot is wrong).

Scores: fp16 inputs make every product exact in fp32, so kernel and reference differ only in
the order of fp32 sums (a few ulps). Masks: equal wherever a block's score is not within 1e-4
(relative) of the threshold, where the order of a float sum cannot flip the decision.
"""

import math

import pytest
import torch

import s2o
from s2o.kernels.flashprefill_select import flashprefill_select
from s2o.methods import flashprefill as fp

pytestmark = pytest.mark.interpreter

CASES = [  # B, Hq, Hkv, L, D, bs, block_n, dtype: GQA 1/4/6, batch 2, L % bs != 0, >1 chunk
    (2, 2, 2, 300, 16, 16, 16, torch.float16),
    (1, 4, 1, 300, 32, 16, 16, torch.float32),
    (2, 6, 1, 600, 16, 32, 16, torch.float16),  # 19 blocks: 2 chunks of 16, the second partial
    (1, 8, 2, 256, 64, 32, 32, torch.float16),
    (1, 2, 1, 77, 16, 16, 16, torch.float32),
]


def _qkv(B, Hq, Hkv, L, D, dtype, gen):
    q = torch.randn(B, Hq, L, D, generator=gen) * 1.5
    k = torch.randn(B, Hkv, L, D, generator=gen)
    k[:, :, 3] += 2.0 * q.mean((1, 2))[:, None]
    return q.to(dtype), k.to(dtype), torch.randn(B, Hkv, L, D, generator=gen).to(dtype)


@pytest.mark.parametrize("B,Hq,Hkv,L,D,bs,bn,dtype", CASES)
@pytest.mark.parametrize("rule", [(0.1, 2, 4, 2), (0.5, 0, 1, 0), (0.9, 1, 2, 1)])
def test_selection_kernel_equals_reference(B, Hq, Hkv, L, D, bs, bn, dtype, rule, gen):
    alpha, sink, local, tail = rule
    q, k, _ = _qkv(B, Hq, Hkv, L, D, dtype, gen)
    knobs = dict(alpha=alpha, sink_blocks=sink, local_blocks=local, dense_tail_tiles=tail)
    mask, scores = flashprefill_select(q, k, block_size=bs, scale=D**-0.5, block_n=bn, **knobs)
    ref = fp.tile_scores(q, k, block_size=bs, scale=D**-0.5)
    err = float((scores - ref).abs().max())
    assert not scores.isnan().any() and err < 1e-6, f"scores differ by {err:.3e}"
    ref_mask = fp.select(ref, min_budget=0, **knobs) & fp.block_causal(ref.shape[-1], q.device)
    thr = alpha * ref.amax(-1, keepdim=True)
    clear = (ref - thr).abs() > 1e-4 * thr
    assert torch.equal(mask & clear, ref_mask & clear)
    assert float(clear.double().mean()) > 0.95, "too few unambiguous blocks to test anything"
    assert torch.equal(mask, mask.tril())


def test_method_triton_path_with_min_budget_equals_reference_path(gen):
    q, k, v = _qkv(2, 4, 1, 500, 16, torch.float32, gen)
    m = s2o.METHODS["flashprefill"]
    knobs = {**m.defaults, "alpha": 0.95, "block_size": 16, "min_budget": 5}
    tri = m.estimate(q, k, v, **{**knobs, "impl": "triton"})
    ref = m.estimate(q, k, v, **{**knobs, "impl": "reference"})
    agree = float((tri.mask == ref.mask).double().mean())
    assert agree > 0.999, f"masks agree on {agree:.5f} of the entries"
    nb = math.ceil(500 / 16)
    rows = tri.mask.sum(-1)
    assert bool((rows >= torch.arange(nb).clamp(max=4) + 1).all()), "fewer than min_budget blocks"


def test_kernel_refuses_small_tiles(gen):
    q, k, _ = _qkv(1, 2, 1, 64, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="block_size must be a power of two >= 16.*got 8"):
        flashprefill_select(q, k, block_size=8, scale=0.25, alpha=0.1, sink_blocks=2,
                            local_blocks=4, dense_tail_tiles=2)  # fmt: skip


# ------------------------------------------------------------------ v2's mean correction

MC_CASES = [  # B, Hq, Hkv, L, D, bs, dtype: GQA 1/4/4, batch 2, L % bs != 0
    (2, 2, 2, 77, 32, 16, torch.float32),
    (2, 4, 1, 150, 16, 16, torch.float16),
    (1, 8, 2, 150, 16, 32, torch.float16),
]
PRUNE = dict(sink_blocks=0, local_blocks=1, dense_tail_tiles=1)


def _tol(ref: torch.Tensor) -> float:
    """The reference's own error: one rounding of its output to the input dtype (fp32: its sums
    in another order, ~1e-6 relative)."""
    eps = 1e-6 if ref.dtype == torch.float32 else torch.finfo(ref.dtype).eps
    return eps * float(ref.abs().max())


@pytest.mark.parametrize("B,Hq,Hkv,L,D,bs,dtype", MC_CASES)
def test_mean_correction_triton_path_equals_reference(B, Hq, Hkv, L, D, bs, dtype, gen):
    q, k, v = _qkv(B, Hq, Hkv, L, D, dtype, gen)
    q = (q.float() * 0.3).to(dtype)  # small logits: pruned blocks carry mass
    m = s2o.METHODS["flashprefill"]
    knobs = {**m.defaults, "alpha": 1.0, "block_size": bs, **PRUNE, "mean_correction": True}
    plan = m.estimate(q, k, v, **{**knobs, "impl": "triton"})
    assert bool(fp.correction_blocks(plan.mask).any()), "no pruned block: nothing to test"
    got, stats = m.attend(q, k, v, plan, **{**knobs, "impl": "triton"})
    ref = fp.mean_corrected_reference(q, k, v, plan, None)
    err, tol = float((got.float() - ref.float()).abs().max()), _tol(ref)
    assert got.dtype == dtype and err <= tol, f"max error {err:.3e} > tolerance {tol:.3e}"
    plain, _ = m.attend(q, k, v, plan, **{**knobs, "impl": "triton", "mean_correction": False})
    moved = float((plain.float() - ref.float()).abs().max())
    assert moved > 100 * tol, f"the correction changed the output by {moved:.3e} only"
    assert torch.equal(stats.tiles_processed, fp.plan_stats(plan, L).tiles_processed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mean_correction_triton_path_exact_where_pruned_blocks_are_constant(dtype, gen):
    """Every block's tokens share one key and value: the kernel's output merged with the
    correction is dense attention, to the reference's own rounding."""
    from s2o.methods.full import full_attention

    B, Hq, Hkv, L, D, bs = 1, 4, 1, 150, 16, 16
    nb = math.ceil(L / bs)
    rep = lambda x: x.repeat_interleave(bs, dim=2)[:, :, :L].to(dtype)  # noqa: E731
    q = torch.randn(B, Hq, L, D, generator=gen).to(dtype)
    spread = torch.rand(B, Hkv, nb, 1, generator=gen) * 2  # peaked attention
    k = rep(torch.randn(B, Hkv, nb, D, generator=gen) * spread)
    v = rep(torch.randn(B, Hkv, nb, D, generator=gen))
    knobs = dict(alpha=1.0, block_size=bs, **PRUNE, impl="triton")
    dense = full_attention(q.float(), k.float(), v.float(), backend="math")
    plain, _ = s2o.sparse_attention("flashprefill", q, k, v, **knobs)
    got, _ = s2o.sparse_attention("flashprefill", q, k, v, mean_correction=True, **knobs)
    err, tol = float((got.float() - dense).abs().max()), 2 * _tol(dense.to(dtype))
    assert err <= tol, f"max error {err:.3e} > tolerance {tol:.3e}"
    moved = float((plain.float() - dense).abs().max())
    assert moved > 100 * tol, f"the plain plan differs from dense by {moved:.3e} only"


@pytest.mark.parametrize("B,Hq,Hkv,L,D,bs,dtype", MC_CASES)
def test_block_sparse_kernel_lse(B, Hq, Hkv, L, D, bs, dtype, gen):
    """The row log-sum-exp the correction merges with: torch.logsumexp of the plan's logits; the
    output is the same bits with or without it."""
    from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists
    from s2o.methods.blocksparse import grouped_scores, visible_keys

    q, k, v = _qkv(B, Hq, Hkv, L, D, dtype, gen)
    plan = fp.flashprefill_plan(q, k, alpha=0.9, block_size=bs, min_budget=0, scale=None, **PRUNE)
    idx, cnt = mask_to_lists(plan.mask)
    plain = torch.full_like(q, float("nan"))
    block_sparse_attention(q, k, v, idx, cnt, block_size=bs, out=plain)
    out, lse = torch.full_like(q, float("nan")), torch.full((B, Hq, L), float("nan"))
    block_sparse_attention(q, k, v, idx, cnt, block_size=bs, out=out, lse=lse)
    assert torch.equal(out, plain), "asking for the LSE changed the output"
    rows = torch.arange(L)
    s = grouped_scores(q.float(), k.float(), D**-0.5)
    want = torch.logsumexp(s.masked_fill(~visible_keys(plan, rows, L), float("-inf")), -1)
    err = float((lse - want).abs().max())
    assert err < 1e-5, f"lse differs by {err:.3e}"
    with pytest.raises(ValueError, match=r"lse must be a float32 tensor of shape"):
        block_sparse_attention(q, k, v, idx, cnt, block_size=bs, lse=lse.half())
