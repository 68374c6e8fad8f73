"""The shared block-sparse kernels and the three baselines on the GPU (bf16/fp16).

Oracle: float64 attention with the plan's token mask (``s2o.methods.blocksparse`` builds the
mask, the product runs here in float64). Tolerance: twice the oracle's own error when its
probabilities are rounded to the input dtype before ``P V``, plus 1e-6. Outputs are NaN-filled.
"""

import math

import pytest
import torch

import s2o
from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists
from s2o.kernels.xattn_estimate import xattn_block_scores
from s2o.methods.blocksparse import BlockPlan, key_block_of_token
from s2o.methods.xattn import antidiagonal_block_scores

pytestmark = pytest.mark.gpu


def _qkv(B, Hq, Hkv, L, D, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, device="cuda")
    k = torch.randn(B, Hkv, L, D, generator=g, device="cuda")
    k[:, :, 0] += 3.0 * q.mean(dim=2).view(B, Hkv, -1, D).mean(dim=2)  # an attention sink
    v = torch.randn(B, Hkv, L, D, generator=g, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _token_mask(plan: BlockPlan, L):
    kblk = key_block_of_token(plan, L)
    tok = torch.arange(L, device=plan.mask.device)
    sel = plan.mask[:, :, tok // plan.block_size]  # [B, H, L, NB]
    if kblk.dim() == 1:
        vis = sel[..., kblk]
    else:
        vis = torch.gather(sel, -1, kblk[:, :, None, :].expand(-1, -1, L, -1))
    if plan.key_perm is not None:
        vis |= tok[None, :] >= (tok[:, None] // plan.segment_size) * plan.segment_size
    return vis & (tok[None, :] <= tok[:, None])


def _oracle(q, k, v, vis, round_to=None):
    G = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = (qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~vis, -math.inf)
    p = torch.exp(s - s.amax(-1, keepdim=True).clamp(min=-1e30))
    l = p.sum(-1, keepdim=True)
    if round_to is not None:
        p = p.to(round_to).double()
    return ((p @ vd) / l).nan_to_num(0.0)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _check(out, q, k, v, plan):
    vis = _token_mask(plan, q.shape[2])
    exact = _oracle(q, k, v, vis)
    yard = _rel(_oracle(q, k, v, vis, round_to=q.dtype).to(q.dtype), exact)
    err = _rel(out, exact)
    assert not out.isnan().any(), "unwritten output (NaN)"
    assert err <= 2 * yard + 1e-6, f"kernel rel err {err:.3e} > 2 x yardstick {yard:.3e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bs,D", [(128, 128), (64, 64), (128, 64), (128, 256), (64, 256)])
# None: TMA descriptor loads of contiguous blocks where the GPU has them; False: pointer loads
@pytest.mark.parametrize("descriptors", [None, False])
def test_block_sparse_kernel_gpu(bs, D, dtype, descriptors):
    B, Hq, Hkv, L = 2, 8, 2, 1000
    q, k, v = _qkv(B, Hq, Hkv, L, D, seed=bs + D, dtype=dtype)
    nb = math.ceil(L / bs)
    g = torch.Generator(device="cuda").manual_seed(1)
    tril = torch.ones(nb, nb, dtype=torch.bool, device="cuda").tril()
    mask = (torch.rand(B, Hq, nb, nb, generator=g, device="cuda") < 0.3) & tril
    mask |= torch.eye(nb, dtype=torch.bool, device="cuda")
    plan = BlockPlan(mask, bs)
    idx, cnt = mask_to_lists(mask)
    out = torch.full_like(q, float("nan"))
    block_sparse_attention(q, k, v, idx, cnt, block_size=bs, out=out, descriptors=descriptors)
    _check(out, q, k, v, plan)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_block_sparse_kernel_noncausal_gpu(D):
    """Non-causal lists (blocks after the diagonal, the tail block past L) against the oracle
    with the same token mask and no causal cut."""
    B, Hq, Hkv, L, bs = 1, 8, 2, 1000, 128
    q, k, v = _qkv(B, Hq, Hkv, L, D, seed=7)
    nb = math.ceil(L / bs)
    g = torch.Generator(device="cuda").manual_seed(3)
    mask = torch.rand(B, Hq, nb, nb, generator=g, device="cuda") < 0.4
    mask[..., -1] = True
    idx, cnt = mask_to_lists(mask)
    out = torch.full_like(q, float("nan"))
    block_sparse_attention(q, k, v, idx, cnt, block_size=bs, out=out, causal=False)
    tok = torch.arange(L, device="cuda")
    vis = mask[:, :, tok // bs][..., tok // bs]
    exact = _oracle(q, k, v, vis)
    yard = _rel(_oracle(q, k, v, vis, round_to=q.dtype).to(q.dtype), exact)
    err = _rel(out, exact)
    assert not out.isnan().any() and err <= 2 * yard + 1e-6, f"{err:.3e} vs {yard:.3e}"


@pytest.mark.parametrize("D", [128, 256])
def test_permuted_kernel_gpu(D):
    B, Hq, Hkv, L, bs, seg = 1, 8, 2, 1100, 128, 256
    q, k, v = _qkv(B, Hq, Hkv, L, D, seed=3)
    nb = math.ceil(L / bs)
    g = torch.Generator(device="cuda").manual_seed(2)
    lc = (L // seg) * seg
    noise = torch.rand(B, Hq, L // seg, seg, generator=g, device="cuda")
    perm = torch.argsort(noise, -1) + torch.arange(0, lc, seg, device="cuda")[:, None]
    perm = torch.cat(
        [perm.view(B, Hq, lc), torch.arange(lc, L, device="cuda").expand(B, Hq, -1)], -1
    )
    r = torch.arange(nb, device="cuda")
    before_own = r[None, :] < (r[:, None] // (seg // bs)) * (seg // bs)
    mask = (torch.rand(B, Hq, nb, nb, generator=g, device="cuda") < 0.5) & before_own
    plan = BlockPlan(mask, bs, key_perm=perm.int(), segment_size=seg)
    idx, cnt = mask_to_lists(mask)
    out = torch.full_like(q, float("nan"))
    block_sparse_attention(
        q, k, v, idx, cnt, block_size=bs, key_perm=plan.key_perm, segment_size=seg, out=out
    )
    _check(out, q, k, v, plan)


@pytest.mark.parametrize("stride,D", [(16, 128), (8, 128), (8, 64), (8, 256)])
def test_xattn_scores_kernel_gpu(stride, D):
    q, k, _ = _qkv(1, 8, 2, 3000, D, seed=4)
    ref = antidiagonal_block_scores(q, k, block_size=128, stride=stride, scale=D**-0.5, norm=1.0)
    out = xattn_block_scores(q, k, block_size=128, stride=stride, scale=D**-0.5)
    err = float((out - ref).abs().max())  # block sums are O(1) .. O(block/stride)
    assert err < 1e-3, f"block scores differ by {err:.3e}"


@pytest.mark.parametrize("method", ["flexprefill", "flashprefill", "xattn", "pbs"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_methods_gpu_triton_vs_reference(method, D):
    """Defaults, L=4000: the Triton path equals the reference path run on the same plan."""
    m = s2o.METHODS[method]
    q, k, v = _qkv(1, 8, 2, 4000, D, seed=5)
    knobs = {**m.defaults, "impl": "triton"}
    if method == "flashprefill":
        knobs["alpha"] = 0.1  # no default: per model family
    plan = m.estimate(q, k, v, **knobs)
    out, stats = m.attend(q, k, v, plan, **knobs)
    assert 0.0 <= stats.sparsity < 1.0
    _check(out, q, k, v, plan)
    if method == "xattn":  # fused estimator vs plain-PyTorch estimator on the same inputs
        ref_plan = m.estimate(q, k, v, **{**knobs, "impl": "reference"})
        agree = float((ref_plan.mask == plan.mask).double().mean())
        assert agree > 0.999, f"block masks agree on {agree:.5f} of the entries"
