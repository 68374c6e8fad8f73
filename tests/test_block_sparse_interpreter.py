"""The shared block-sparse kernels under TRITON_INTERPRET=1 (tiny shapes, fp16/fp32).

The oracle is float64 attention with an explicitly built token mask (no code shared with the
kernel or with ``s2o.methods``). Tolerance: twice the error of the oracle itself when its
probabilities are rounded to the input dtype before ``P V`` (what the kernel does), plus 1e-6.
"""

import math

import pytest
import torch

from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists
from s2o.kernels.launch import Launch
from s2o.kernels.xattn_estimate import xattn_block_scores
from s2o.methods.xattn import antidiagonal_block_scores

pytestmark = pytest.mark.interpreter


def _token_mask(L, bs, mask, perm=None, seg=None, causal=True):
    """``[B, H, L, L]`` bool: (query i, key token j) visible, built with plain loops."""
    B, H, nb, _ = mask.shape
    out = torch.zeros(B, H, L, L, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            pos = list(range(L)) if perm is None else [0] * L
            if perm is not None:
                for p, t in enumerate(perm[b, h].tolist()):
                    pos[t] = p
            for i in range(L):
                r = i // bs
                for j in range(i + 1 if causal else L):
                    own = seg is not None and (i // seg) * seg <= j < (i // seg + 1) * seg
                    out[b, h, i, j] = own or bool(mask[b, h, r, pos[j] // bs])
    return out


def _oracle(q, k, v, tmask, round_to=None):
    G = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = (qd @ kd.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~tmask, -math.inf)
    m = s.amax(-1, keepdim=True).clamp(min=-1e30)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    if round_to is not None:
        p = p.to(round_to).double()
    out = (p @ vd) / l
    return out.nan_to_num(0.0)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _check(out, q, k, v, tmask):
    exact = _oracle(q, k, v, tmask)
    yard = _rel(_oracle(q, k, v, tmask, round_to=q.dtype).to(q.dtype), exact)
    err = _rel(out, exact)
    assert not out.isnan().any(), "unwritten output (NaN)"
    assert err <= 2 * yard + 1e-6, f"kernel rel err {err:.3e} > 2 x yardstick {yard:.3e}"


def _random_mask(B, H, nb, density, gen, diag=True, causal=True):
    m = torch.rand(B, H, nb, nb, generator=gen) < density
    if causal:
        m &= torch.ones(nb, nb, dtype=torch.bool).tril()
    if diag:
        m |= torch.eye(nb, dtype=torch.bool)
    return m


SHAPES = [  # D, bs, sub_n (key rows per product inside a block), dtype
    (32, 16, None, torch.float16),
    (32, 16, None, torch.float32),
    (64, 32, 16, torch.float16),
    (256, 16, None, torch.float16),
    (256, 32, 16, torch.float32),
]


def _shape_id(c):
    return f"D{c[0]}-bs{c[1]}-sub{c[2]}-{str(c[3])[6:]}"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("D,bs,sub_n,dtype", SHAPES, ids=[_shape_id(c) for c in SHAPES])
def test_block_sparse_kernel_matches_masked_dense(D, bs, sub_n, dtype, causal, gen, **kw):
    B, Hq, Hkv, L = 2, 4, 2, 77 if bs == 16 else 83
    q, k, v = (torch.randn(B, h, L, D, generator=gen).to(dtype) for h in (Hq, Hkv, Hkv))
    nb = math.ceil(L / bs)
    mask = _random_mask(B, Hq, nb, 0.4, gen, causal=causal)
    mask[0, 1, 1, 1] = False  # a query block without its diagonal
    mask[1, 0, 2] = False  # a query block with nothing selected: output 0
    mask[0, 0, 0, nb - 1] = not causal  # non-causal: a row that sees the tail block past L
    idx, cnt = mask_to_lists(mask)
    out = torch.full_like(q, float("nan"))
    block_sparse_attention(q, k, v, idx, cnt, block_size=bs, out=out, causal=causal,
                           launch=Launch(sub_n=sub_n), **kw)  # fmt: skip
    _check(out, q, k, v, _token_mask(L, bs, mask, causal=causal))
    assert bool((out[1, 0, 2 * bs : 3 * bs] == 0).all())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("D,bs,sub_n,dtype", SHAPES, ids=[_shape_id(c) for c in SHAPES])
def test_permuted_kernel_matches_masked_dense(D, bs, sub_n, dtype, causal, gen):
    B, Hq, Hkv, L, seg = 1, 4, 1, 77 if bs == 16 else 83, 2 * bs
    q, k, v = (torch.randn(B, h, L, D, generator=gen).to(dtype) for h in (Hq, Hkv, Hkv))
    nb = math.ceil(L / bs)
    perm = torch.arange(L).repeat(B, Hq, 1)
    for n in range(L // seg):  # shuffle inside complete segments, tail in place
        for h in range(Hq):
            perm[0, h, n * seg : (n + 1) * seg] = n * seg + torch.randperm(seg, generator=gen)
    r = torch.arange(nb)
    own = r[:, None] // (seg // bs)
    if causal:
        allowed = r[None, :] < own * (seg // bs)
    else:  # permuted blocks outside the own segment (the tail block's slots past L included)
        allowed = (r[None, :] // (seg // bs)) != own
    mask = _random_mask(B, Hq, nb, 0.5, gen, diag=False, causal=causal) & allowed
    idx, cnt = mask_to_lists(mask)
    out = torch.full_like(q, float("nan"))
    block_sparse_attention(
        q, k, v, idx, cnt, block_size=bs, key_perm=perm.int(), segment_size=seg, out=out,
        causal=causal, launch=Launch(sub_n=sub_n),
    )  # fmt: skip
    _check(out, q, k, v, _token_mask(L, bs, mask, perm, seg, causal=causal))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_kernel_with_descriptor_loads(causal, gen):
    """The key blocks through TMA tensor descriptors (the Hopper path, off on the CPU by default):
    the listed blocks and the band, with a tail block past L. (The permuted PBS kernel never uses
    them: its blocks are gathered through the permutation.)"""
    test_block_sparse_kernel_matches_masked_dense(
        64, 32, 16, torch.float16, causal, gen, descriptors=True
    )


def test_block_sparse_refuses_other_head_dims(gen):
    q = torch.randn(1, 2, 40, 80, generator=gen).half()
    idx, cnt = mask_to_lists(torch.ones(1, 2, 3, 3, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="got 80"):
        block_sparse_attention(q, q, q, idx, cnt, block_size=16)


def test_mask_to_lists_roundtrip(gen):
    mask = torch.rand(2, 3, 5, 7, generator=gen) < 0.5
    idx, cnt = mask_to_lists(mask)
    for b, h, r in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(5)).tolist():
        assert idx[b, h, r, : cnt[b, h, r]].tolist() == mask[b, h, r].nonzero().flatten().tolist()


@pytest.mark.parametrize("L,bs,stride,D", [(77, 16, 4, 16), (64, 32, 8, 16), (77, 16, 4, 256)])
def test_xattn_scores_kernel_matches_reference(L, bs, stride, D, gen):
    q = torch.randn(1, 4, L, D, generator=gen)
    k = torch.randn(1, 2, L, D, generator=gen)
    k[:, :, 3] += 2 * q.mean((1, 2))[:, None]
    ref = antidiagonal_block_scores(q, k, block_size=bs, stride=stride, scale=0.25, norm=1.0)
    out = xattn_block_scores(q, k, block_size=bs, stride=stride, scale=0.25, norm=1.0)
    err = float((out - ref).abs().max())
    assert err < 1e-5, f"block scores differ by {err}"
    rows = ref.sum(-1)
    assert torch.allclose(rows[..., : L // bs], torch.full_like(rows[..., : L // bs], bs / stride))


@pytest.mark.parametrize(
    "method,knobs",
    [
        ("flexprefill", dict(min_budget=None, block_size=128, gamma=0.3)),
        ("flashprefill", dict(block_size=16, alpha=0.99)),  # random inputs: near-uniform scores
        ("xattn", dict(block_size=16, stride=4, threshold=0.8)),
        ("pbs", dict(block_size=16, segment_size=32, threshold=0.8)),
    ],
)
def test_methods_triton_path_matches_reference_path(method, knobs, gen):
    """Same plan (estimated on the reference path), both attention paths, fp32."""
    import s2o

    m = s2o.METHODS[method]
    L = 700 if method == "flexprefill" else 300
    q = torch.randn(1, 4, L, 16, generator=gen)
    k, v = torch.randn(1, 2, L, 16, generator=gen), torch.randn(1, 2, L, 16, generator=gen)
    full = {**m.defaults, **knobs}
    plan = m.estimate(q, k, v, **{**full, "impl": "reference"})
    out_ref, st_ref = m.attend(q, k, v, plan, **{**full, "impl": "reference"})
    out_tri, st_tri = m.attend(q, k, v, plan, **{**full, "impl": "triton"})
    assert 0 < st_ref.sparsity < 1, st_ref.sparsity
    assert torch.equal(st_ref.tiles_processed, st_tri.tiles_processed)
    err = _rel(out_tri, out_ref)
    assert err < 1e-5, f"{method}: triton vs reference rel err {err:.3e}"
    if method in ("xattn", "flashprefill"):  # the Triton estimator selects the same blocks
        plan_tri = m.estimate(q, k, v, **{**full, "impl": "triton"})
        assert torch.equal(plan_tri.mask, plan.mask)
