"""S2O Triton kernels on the GPU in bf16: against the reference (run on the same GPU in fp32) at
moderate L, against SDPA at long L with ``tau <= 0``; outputs NaN-filled before every launch."""

import math

import pytest
import torch

from s2o.kernels import s2o_step1, s2o_triton
from s2o.reference import s2o_permutations, s2o_reference

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def _qkv(B, Hq, Hkv, L, D, seed, peak=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, device="cuda") * peak
    k = torch.randn(B, Hkv, L, D, generator=g, device="cuda")
    k[:, :, 0] += 3.0 * q.mean(dim=2).view(B, Hkv, -1, D).mean(dim=2)  # an attention sink
    v = torch.randn(B, Hkv, L, D, generator=g, device="cuda")
    return q.to(BF16), k.to(BF16), v.to(BF16)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _sdpa(q, k, v, backend, causal=True):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=causal)


def test_step1_gpu_equals_reference_on_exact_data():
    """Multiples of 1/4: fp32 scores are exact on both sides, so the orders must be identical."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randint(-8, 9, (1, 8, 1088, 128), generator=g, device="cuda").float() / 4
    k = torch.randint(-8, 9, (1, 2, 1088, 128), generator=g, device="cuda").float() / 4
    q, k = q.to(BF16), k.to(BF16)
    for W in (0, 128):
        rqp, rkvp = s2o_permutations(q.cpu(), k.cpu(), 256, W)
        modes = ((torch.int64, "full"), (torch.int32, "full"), (torch.int64, "chunks"),
                 (torch.int32, "cub"))  # fmt: skip
        for dtype, mode in modes:
            qp, kvp = s2o_step1(q, k, segment_len=256, local_window=W, index_dtype=dtype,
                                sort_mode=mode)  # fmt: skip
            assert kvp.dtype == dtype
            assert torch.equal(qp.cpu(), rqp), f"W={W}: q_perm differs"
            assert torch.equal(kvp.cpu().long(), rkvp), f"W={W} {dtype} {mode}: kv_perm differs"


def test_step1_gpu_long_is_a_ranking():
    """At 32K: every row is a permutation of its prefix, padded with -1, scores non-increasing."""
    q, k, _ = _qkv(1, 8, 2, 32768, 128, seed=1)
    S = 2048
    qp, kvp = s2o_step1(q, k, segment_len=S)
    n = 7
    row = kvp[0, 3, n]
    P = n * S
    assert bool((row[P:] == -1).all()) and torch.equal(
        row[:P].sort().values, torch.arange(P).cuda()
    )
    qm = q[0, 3, n * S : (n + 1) * S].double().mean(0)
    s = k[0, 3 // 4, row[:P]].double() @ qm
    assert bool((s[1:] <= s[:-1] + 1e-4 * s.abs().max()).all()), "kv_perm is not descending"
    seg = qp[0, 3, n * S : (n + 1) * S]
    assert torch.equal(seg.sort().values, torch.arange(n * S, (n + 1) * S).cuda())


@pytest.mark.parametrize("L,S,W", [(32768, 2048, 0), (131072, 2048, 0), (20000, 512, 300)])
def test_step1_gpu_cub_equals_torch_sort(L, S, W):
    """CUB's radix sort over packed (row, score) keys and torch.sort rank the same fp32 scores
    (both from the key-score kernel for bf16 K): identical kv_perm, bit for bit, at scale."""
    q, k, _ = _qkv(1, 32, 8, L, 128, seed=2)
    qa, ka = s2o_step1(q, k, segment_len=S, local_window=W, sort_mode="cub")
    qb, kb = s2o_step1(q, k, segment_len=S, local_window=W, sort_mode="chunks")
    assert torch.equal(qa, qb)
    diff = (ka != kb).nonzero()
    assert diff.numel() == 0, f"{len(diff)} positions differ, first {diff[:5].tolist()}"


@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("fused", False)])
@pytest.mark.parametrize("L,W", [(3000, 0), (8192, 256)])
# None: TMA descriptor loads of the dense tiles where the GPU has them; False: pointer loads
@pytest.mark.parametrize("descriptors", [None, False])
def test_gpu_matches_reference(variant, q_perm, L, W, descriptors, D=128, causal=True):
    """bf16 kernel vs the fp32 reference on the same GPU: same decisions, output within 2x the
    error of bf16 SDPA (flash) against the fp32 reference at tau <= 0."""
    q, k, v = _qkv(1, 4, 2, L, D, seed=2, peak=1.5)
    knobs = dict(segment_len=1024, block_m=128, block_n=128, local_window=W, q_perm=q_perm,
                 causal=causal)  # fmt: skip
    perms = s2o_permutations(q, k, 1024, W, causal)
    dense_ref, _ = s2o_reference(q, k, v, tau=0.0, perms=perms, **knobs)
    tol = 2 * _rel(_sdpa(q, k, v, "FLASH_ATTENTION", causal), dense_ref) + 1e-4
    decided = 0
    for tau in (0.0, 0.01, 0.05, 0.2):
        ref, rst = s2o_reference(q, k, v, tau=tau, perms=perms, **knobs)
        if tau > 0:  # only taus whose decisions do not move under +-1% count
            lo = s2o_reference(q, k, v, tau=tau * 0.99, perms=perms, **knobs)[1]
            hi = s2o_reference(q, k, v, tau=tau * 1.01, perms=perms, **knobs)[1]
            want = rst.extra["pass2_tiles"]
            if not (torch.equal(lo.extra["pass2_tiles"], want) and
                    torch.equal(hi.extra["pass2_tiles"], want)):  # fmt: skip
                continue
            decided += 1
        for stop_tile in ("keep", "discard") if tau > 0 else ("keep",):
            kw = dict(tau=tau, perms=perms, stop_tile=stop_tile, **knobs)
            ref, rst = s2o_reference(q, k, v, **kw)
            out = torch.full_like(q, float("nan"))
            out, st = s2o_triton(q, k, v, variant=variant, out=out, descriptors=descriptors, **kw)
            assert not out.isnan().any(), f"tau={tau}: unwritten outputs"
            err = _rel(out, ref)
            assert err <= tol, f"tau={tau} {stop_tile}: rel err {err:.3e} > {tol:.3e}"
            assert torch.equal(st.extra["pass2_tiles"].cpu(), rst.extra["pass2_tiles"].cpu())
            assert torch.equal(st.tiles_processed.cpu(), rst.tiles_processed.cpu())
    assert decided > 0, "no unambiguous tau: the early-stop path was not compared"


@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("fused", False)])
def test_gpu_matches_reference_head_dims(D, causal, variant, q_perm):
    """Head sizes 64 and 256 (its default 64-key sub-tiles), causal and not, at L=3000 with a
    local window: the same decisions and outputs as the fp32 reference."""
    test_gpu_matches_reference(variant, q_perm, 3000, 256, None, D=D, causal=causal)


@pytest.mark.parametrize(
    "L,D,causal",
    [(8192, 128, True), (32768, 128, True), (131072, 128, True), (32768, 64, True),
     (32768, 256, True), (8192, 64, False), (8192, 256, False), (16384, 128, False)],
)  # fmt: skip
def test_gpu_tau0_equals_sdpa(L, D, causal):
    """No early stop at long L: S2O equals dense attention (fp32 reference: SDPA's
    memory-efficient kernel on fp32 inputs); tolerance 2x the error of bf16 SDPA flash."""
    Hq, Hkv = 8, 2
    q, k, v = _qkv(1, Hq, Hkv, L, D, seed=3)
    ref = _sdpa(q.float(), k.float(), v.float(), "EFFICIENT_ATTENTION", causal)
    tol = 2 * _rel(_sdpa(q, k, v, "FLASH_ATTENTION", causal), ref) + 1e-4
    for variant, qperm in (("two_pass", True), ("fused", False)):
        out = torch.full_like(q, float("nan"))
        out, st = s2o_triton(
            q, k, v, variant=variant, segment_len=2048, tau=0.0, block_m=128, block_n=128,
            local_window=0, q_perm=qperm, out=out, causal=causal,
        )  # fmt: skip
        assert not out.isnan().any(), f"{variant}: {int(out.isnan().sum())} unwritten outputs"
        err = _rel(out, ref)
        assert err <= tol, f"L={L} D={D} {variant}: rel err {err:.3e} > {tol:.3e}"
        assert st.sparsity == 0.0
        assert math.isclose(st.density, 1.0)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("fused", False)])
def test_gpu_topk_matches_reference(D, causal, variant, q_perm):
    """S2O's top-k mode (Fig. 5) in bf16 at L=8192: exactly the reference's tiles per query tile
    and its output within 2x bf16 flash's error against the fp32 reference, at two ratios."""
    L, S = 8192, 1024
    q, k, v = _qkv(1, 4, 2, L, D, seed=5, peak=1.5)
    knobs = dict(segment_len=S, block_m=128, block_n=128, local_window=0, q_perm=q_perm,
                 causal=causal, tau=0.0)  # fmt: skip
    perms = s2o_permutations(q, k, S, 0, causal)
    dense_ref, _ = s2o_reference(q, k, v, perms=perms, **knobs)
    tol = 2 * _rel(_sdpa(q, k, v, "FLASH_ATTENTION", causal), dense_ref) + 1e-4
    for ratio in (0.1, 0.5):
        ref, rst = s2o_reference(q, k, v, perms=perms, topk_ratio=ratio, **knobs)
        out = torch.full_like(q, float("nan"))
        out, st = s2o_triton(q, k, v, variant=variant, out=out, perms=perms, topk_ratio=ratio,
                             **knobs)  # fmt: skip
        assert not out.isnan().any(), f"ratio {ratio}: unwritten outputs"
        err = _rel(out, ref)
        assert err <= tol, f"ratio {ratio}: rel err {err:.3e} > {tol:.3e}"
        assert torch.equal(st.extra["pass2_tiles"].cpu(), rst.extra["pass2_tiles"].cpu())
        assert 0 < st.sparsity == rst.sparsity


@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("fused", False)])
@pytest.mark.parametrize("knob", [{"dense_tail": 128}, {"tail_rank": 128}, {"tail_rank": 300}],
                         ids=["dense_tail128", "tail_rank128", "tail_rank300"])  # fmt: skip
@pytest.mark.parametrize("L", [8192, 7000])
def test_gpu_named_variants_match_reference(variant, q_perm, knob, L):
    """The named variants (s2o/dense_tail.py, s2o/tail_rank.py) in bf16 on the GPU: the same
    tiles per query tile as the fp32 reference and the output within 2x bf16 flash's error, at
    taus whose decisions are unambiguous, L a multiple of the segment and not."""
    S = 1024
    q, k, v = _qkv(1, 4, 2, L, 128, seed=7, peak=1.5)
    knobs = dict(segment_len=S, block_m=128, block_n=128, local_window=0, q_perm=q_perm, **knob)
    perms = s2o_permutations(q, k, S, 0, True, knob.get("dense_tail", 0), knob.get("tail_rank", 0))
    dense_ref, _ = s2o_reference(q, k, v, tau=0.0, perms=perms, **knobs)
    tol = 2 * _rel(_sdpa(q, k, v, "FLASH_ATTENTION"), dense_ref) + 1e-4
    decided = 0
    for tau in (0.005, 0.01, 0.05, 0.2):  # only taus whose decisions do not move under +-1%
        ref, rst = s2o_reference(q, k, v, tau=tau, perms=perms, **knobs)
        want = rst.extra["pass2_tiles"]
        if not all(
            torch.equal(
                s2o_reference(q, k, v, tau=t, perms=perms, **knobs)[1].extra["pass2_tiles"], want
            )
            for t in (tau * 0.99, tau * 1.01)
        ):
            continue
        decided += 1
        out = torch.full_like(q, float("nan"))
        out, st = s2o_triton(q, k, v, variant=variant, out=out, perms=perms, tau=tau, **knobs)
        assert not out.isnan().any(), f"tau={tau}: unwritten outputs"
        err = _rel(out, ref)
        assert err <= tol, f"tau={tau}: rel err {err:.3e} > {tol:.3e}"
        assert torch.equal(st.extra["pass2_tiles"].cpu(), want.cpu())
        assert torch.equal(st.tiles_processed.cpu(), rst.tiles_processed.cpu())
    assert decided > 0, "no unambiguous tau: the early-stop path was not compared"


@pytest.mark.parametrize("L,Hq,Hkv,D", [(8192, 12, 2, 128), (5000, 8, 8, 64), (4100, 4, 1, 256)])
def test_gpu_flashprefill_selection_matches_reference(L, Hq, Hkv, D):
    """FlashPrefill's Triton selection compiled for the GPU (bf16, the official 128-token blocks)
    against the PyTorch reference on the same inputs: tile scores to fp32 summation order, masks
    equal wherever a block's score is not within 1e-4 of the threshold."""
    from s2o.kernels.flashprefill_select import flashprefill_select
    from s2o.methods import flashprefill as fp

    q, k, _ = _qkv(1, Hq, Hkv, L, D, seed=L)
    knobs = dict(alpha=0.08, sink_blocks=2, local_blocks=4, dense_tail_tiles=2)
    mask, scores = flashprefill_select(q, k, block_size=128, scale=D**-0.5, **knobs)
    ref = fp.tile_scores(q, k, block_size=128, scale=D**-0.5)  # pools in bf16 as the kernel does
    assert not scores.isnan().any()
    err = float((scores.float() - ref).abs().max())
    assert err < 1e-3, f"tile scores differ by {err:.3e}"
    ref_mask = fp.select(ref, min_budget=0, **knobs) & fp.block_causal(ref.shape[-1], q.device)
    thr = knobs["alpha"] * ref.amax(-1, keepdim=True)
    clear = (ref - thr).abs() > 1e-3 * thr
    assert torch.equal(mask & clear, ref_mask & clear)
    assert float(clear.double().mean()) > 0.95


@pytest.mark.parametrize("L,S,W,Hq,Hkv", [(8192, 2048, 0, 4, 1), (7000, 1024, 256, 4, 2)])
@pytest.mark.parametrize("tau,early_stop", [(0.005, True), (0.05, True), (0.0, True), (0.0, False)])
@pytest.mark.parametrize("stages", [3])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_gpu_gluon_walk_equals_triton_walk(L, S, W, Hq, Hkv, tau, early_stop, stages, dtype):
    """The Gluon walk (s2o.kernels.gluon_walk) makes the Triton walk's decisions on the same
    inputs: the same tiles visited by every query tile, the same output up to rounding."""
    from s2o.kernels import Launch, s2o_pass1, s2o_pass2

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon walk needs an sm_90 GPU")
    q, k, v = (t.to(dtype) for t in _qkv(1, Hq, Hkv, L, 128, seed=7, peak=2.0))
    geo = dict(segment_len=S, local_window=W, block_m=128, block_n=128)
    perms = s2o_step1(q, k, segment_len=S, local_window=W, index_dtype=torch.int32)
    state = s2o_pass1(q, k, v, **geo)
    kw = dict(tau=tau, early_stop=early_stop, **geo)
    ref, ref_vis = s2o_pass2(q, k, v, state, *perms, launch=Launch(walk="triton"), **kw)
    out, vis = s2o_pass2(q, k, v, state, *perms,
                         launch=Launch(walk="gluon", num_stages=stages), **kw)  # fmt: skip
    assert torch.equal(vis, ref_vis)
    assert 0 < int(vis.sum()) <= int(ref_vis.numel()) * (L // 128)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    assert _rel(out, ref) < 1e-2
