"""S2O Triton kernels vs the plain-PyTorch reference under TRITON_INTERPRET=1 (tiny shapes).

"The kernel is correct" means: the same Step-1 indices, the same tile decisions (``pass2_tiles``)
and statistics, and outputs within the rounding error of the kernel's own precision. The output
tolerance is derived, not guessed: the kernel rounds the probabilities ``p`` to the input dtype
before the ``P V`` product, so the yardstick is the error of exact attention rounded that way.
"""

import functools
import importlib
import math

import pytest
import torch

from s2o.kernels import Launch, s2o_step1, s2o_triton
from s2o.reference import s2o_permutations, s2o_reference

pytestmark = pytest.mark.interpreter

SEG, BLOCK = 32, 16


def _exact(shape, gen):
    """Multiples of 1/4 in [-2, 2]: every fp32 dot product and segment mean (power-of-two
    counts) is exact, so Step-1 orders are bit-identical and ties really occur."""
    return torch.randint(-8, 9, shape, generator=gen).float() / 4


def _qkv(B, Hq, Hkv, L, D, dtype, gen, peak=1.0):
    q = torch.randn(B, Hq, L, D, generator=gen) * peak
    k = torch.randn(B, Hkv, L, D, generator=gen)
    k[:, :, 0] += 2.0 * q.mean(dim=2).view(B, Hkv, -1, D).mean(dim=2)  # a mild attention sink
    v = torch.randn(B, Hkv, L, D, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _yardstick(q, k, v, causal=True):
    """Relative error of attention whose probabilities and outputs are rounded to q's dtype
    (what the kernel does), against exact fp64 attention."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(group, 1), v.double()
    vd = vd.repeat_interleave(group, 1)
    s = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    exact = (p @ vd) / p.sum(-1, keepdim=True)
    rounded = ((p.to(q.dtype).double() @ vd) / p.sum(-1, keepdim=True)).to(q.dtype)
    return float((rounded - exact).norm() / exact.norm())


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _unambiguous_tau(
    q, k, v, perms, knobs, candidates=(0.02, 0.1, 0.3, 1.0, 3.0, 10.0), reference=None
):
    """First tau that skips tiles and whose reference decisions do not move under +-1% tau
    (decisions do not depend on ``stop_tile``). ``reference(tau)``: the reference's result at that
    tau with ``knobs`` (a caller's cache of them); by default it is computed here."""
    if reference is None:
        reference = functools.cache(
            lambda t: s2o_reference(q, k, v, tau=t, perms=perms, **knobs)
        )  # fmt: skip
    dense = reference(0.0)[1].extra["pass2_tiles"]
    for tau in candidates:
        at = reference(tau)[1].extra["pass2_tiles"]
        if not bool((at < dense).any()):  # skips nothing: the +-1% runs would not matter
            continue
        runs = [reference(t)[1].extra["pass2_tiles"] for t in (tau * 0.99, tau * 1.01)]
        if torch.equal(runs[0], at) and torch.equal(at, runs[1]):
            return tau
    pytest.fail(f"no unambiguous tau with skipping among {candidates}")


@pytest.fixture(params=["one-group", "many-groups"])
def step1_groups(request, monkeypatch):
    """Tiny inputs make one sort group by default (``_MIN_GROUP_KEYS``); ``many-groups`` lowers
    that floor so that groups starting past the first live segment are checked too."""
    step1 = importlib.import_module("s2o.kernels.step1_sort")
    if request.param == "many-groups":
        monkeypatch.setattr(step1, "_MIN_GROUP_KEYS", 1)
    return request.param


def test_step1_sort_groups():
    """Groups cover every live segment once, in order: one group for small inputs, else
    _MAX_SORT_CHUNKS (chunks) or groups of at least _MIN_GROUP_KEYS keys (cub); cub splits
    further where row and position exceed 32 bits."""
    step1 = importlib.import_module("s2o.kernels.step1_sort")

    def check(prefix, rows, mode):
        groups = step1._sort_groups(prefix, rows, mode)
        first = next(n for n, p in enumerate(prefix) if p > 0)
        assert groups[0][0] == first and groups[-1][1] == len(prefix)
        assert all(b0 == a1 for (_, b0), (a1, _) in zip(groups[:-1], groups[1:]))
        return groups

    def prefix(L, S):
        return [n * S for n in range(-(-L // S))]

    assert len(check(prefix(8192, 2048), 32, "chunks")) == 1  # 0.4M keys: host-bound, one group
    assert len(check(prefix(65536, 2048), 32, "chunks")) == step1._MAX_SORT_CHUNKS  # 32.5M keys
    assert len(check(prefix(65536, 2048), 32, "cub")) == 3  # no padding: fewer, larger groups
    assert len(check(prefix(131072, 2048), 32, "chunks")) == step1._MAX_SORT_CHUNKS
    assert len(check(prefix(131072, 2048), 32, "cub")) == step1._MAX_SORT_CHUNKS
    # 2**20 rows of one segment each would need 20 row bits next to 13 position bits: split
    groups = check(prefix(8192, 1024), 1 << 17, "cub")
    widths = [max(1, (b - a) * (1 << 17) - 1).bit_length() for a, b in groups]
    assert len(groups) > 1 and all(w + 13 <= 32 for w in widths), (groups, widths)
    assert step1._sort_groups([0, 0], 4, "chunks") == []


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,D,S,W",
    [
        (1, 4, 2, 100, 16, 32, 0),  # last segment of 4 tokens
        (2, 2, 2, 72, 32, 64, 0),  # batch 2, no GQA, last segment of 8
        (1, 4, 1, 136, 16, 32, 32),  # GQA 4, local window
        (1, 2, 1, 32, 16, 64, 0),  # L < S: one segment, empty kv_perm
        (1, 64, 8, 96, 16, 32, 0),  # 64 rows per segment: "full" sorts one segment per call
    ],
)
# "cub" on CPU tensors sorts its packed keys with torch.sort: this checks the key packing and
# placing kernels; the CUB sort itself is checked on the GPU
@pytest.mark.parametrize(
    "dtype,mode", [(torch.int64, "full"), (torch.int32, "chunks"), (torch.int32, "cub")]
)
def test_step1_indices_equal_reference(B, Hq, Hkv, L, D, S, W, dtype, mode, gen, step1_groups):
    q, k = _exact((B, Hq, L, D), gen), _exact((B, Hkv, L, D), gen)
    qp, kvp = s2o_step1(q, k, segment_len=S, local_window=W, index_dtype=dtype, sort_mode=mode)
    rqp, rkvp = s2o_permutations(q, k, S, W)
    assert qp.dtype == rqp.dtype and kvp.dtype == dtype
    assert qp.shape == rqp.shape and kvp.shape == rkvp.shape, (qp.shape, kvp.shape, rkvp.shape)
    assert torch.equal(qp, rqp), f"q_perm differs at {(qp != rqp).nonzero()[:5].tolist()}"
    kvp = kvp.long()
    assert torch.equal(kvp, rkvp), f"kv_perm differs at {(kvp != rkvp).nonzero()[:5].tolist()}"


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,D,S,W",
    [(1, 4, 2, 100, 16, 32, 0), (1, 4, 1, 136, 16, 32, 32), (1, 64, 1, 152, 16, 16, 8)],
    ids=["gqa2", "window", "rows-past-one-block"],
)
@pytest.mark.parametrize("mode", ["chunks", "full", "cub"])
def test_step1_fused_key_scores_equal_reference(B, Hq, Hkv, L, D, S, W, mode, gen, step1_groups):
    """The key-score kernel (the default for bf16 K on CUDA) with fp32 operands on the CPU: its
    rectangle (torch.sort modes) and its packed keys (cub) give the reference's indices; 64 query
    heads on one key head put 64 x (segments per group) rows into several row blocks."""
    q, k = _exact((B, Hq, L, D), gen), _exact((B, Hkv, L, D), gen)
    qp, kvp = s2o_step1(q, k, segment_len=S, local_window=W, sort_mode=mode, fused_scores=True)
    rqp, rkvp = s2o_permutations(q, k, S, W)
    assert torch.equal(qp, rqp)
    assert torch.equal(kvp, rkvp), f"kv_perm differs at {(kvp != rkvp).nonzero()[:5].tolist()}"


def test_split_bf16_is_exact(gen):
    """The three bf16 terms of the key scores for bf16 K add up to the fp32 segment means exactly
    for ``2**-109 <= |x| <= bf16 max``, so the MMA sums exact fp32 products."""
    from s2o.kernels.s2o_step1 import split_bf16

    x = torch.randn(4, 5000, 8, generator=gen) * torch.exp(
        torch.randn(4, 5000, 8, generator=gen) * 8
    )
    edge = torch.tensor([0.0, -0.0, 1.0 + 2**-23, -(2 - 2**-23), 3.38e38, 2.0**-109, 1.5, -3.0])
    x = torch.cat([x, edge.expand(4, 1, 8)], dim=1)
    parts = split_bf16(x)
    assert parts.dtype == torch.bfloat16 and parts.shape == (4, 3, 5001, 8)
    hi, mid, lo = parts.float().unbind(dim=1)
    assert torch.equal(hi + mid + lo, x)
    assert bool((mid != 0).any()) and bool((lo != 0).any())


@pytest.mark.parametrize("layout", ["bshd", "head_dim_24"])
def test_step1_query_statistics_layouts(layout, gen):
    """The query-statistics kernel on a [B, L, H, D]-strided q, and the PyTorch path that a
    non-power-of-two head_dim takes: the same indices as the reference."""
    D = 24 if layout == "head_dim_24" else 16
    q, k = _exact((1, 4, 100, D), gen), _exact((1, 2, 100, D), gen)
    if layout == "bshd":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    qp, kvp = s2o_step1(q, k, segment_len=32, local_window=8)
    rqp, rkvp = s2o_permutations(q, k, 32, 8)
    assert torch.equal(qp, rqp) and torch.equal(kvp, rkvp)


def test_step1_cub_keys_order_special_values(gen):
    """The packed keys of sort_mode="cub" order +-0, +-inf, NaN, tiny values and ties as
    torch.sort(descending=True, stable=True) does."""
    from s2o.kernels.step1_sort import _rank_chunk

    B, Hq, N, S = 1, 2, 4, 16
    prefix = [n * S for n in range(N)]
    scores = torch.randint(-3, 4, (B, Hq, N - 1, prefix[-1]), generator=gen).float()
    nan = float("nan")
    special = [0.0, -0.0, float("inf"), float("-inf"), nan, -nan, 1e-38, -1e-38]
    scores.view(-1)[torch.randperm(scores.numel(), generator=gen)[:24]] = torch.tensor(special * 3)
    out = {}
    for mode in ("chunks", "cub"):
        kv = torch.empty(B, Hq, N, prefix[-1], dtype=torch.long)
        _rank_chunk(scores.clone(), kv, prefix, 1, S, 0, mode)
        out[mode] = kv[:, :, 1:]
    assert torch.equal(out["cub"], out["chunks"])


def test_step1_cub_rejects_too_many_bits():
    from s2o.kernels.cub_sort import rank_rows

    with pytest.raises(ValueError, match="25 \\+ 8"):
        rank_rows(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), 25, 8)


CASES = [
    # dtype, variant, q_perm, B, Hq, Hkv, L, D, W
    (torch.float16, "two_pass", True, 1, 4, 2, 100, 16, 0),
    (torch.float16, "two_pass", True, 2, 2, 1, 77, 32, 16),
    (torch.float16, "two_pass", False, 1, 2, 2, 100, 16, 0),
    (torch.float16, "fused", False, 1, 4, 2, 100, 16, 0),
    (torch.float16, "fused", False, 1, 2, 1, 90, 32, 32),
    (torch.float32, "two_pass", True, 1, 4, 4, 112, 16, 0),
    (torch.float32, "fused", False, 1, 2, 2, 90, 16, 16),
    (torch.float16, "two_pass", True, 1, 2, 1, 20, 16, 0),  # L < S and L < block
]


@pytest.mark.parametrize("dtype,variant,q_perm,B,Hq,Hkv,L,D,W", CASES)
def test_kernels_match_reference(dtype, variant, q_perm, B, Hq, Hkv, L, D, W, gen):
    _check_kernels(dtype, variant, q_perm, B, Hq, Hkv, L, D, W, gen)


def _check_kernels(dtype, variant, q_perm, B, Hq, Hkv, L, D, W, gen, seg=SEG, block=BLOCK,
                   causal=True, **kernel_kw):  # fmt: skip
    """The kernels (``kernel_kw``: launch settings) against the reference at tau = 0 and at a
    tau that skips, under both stop-tile rules: decisions, statistics and outputs."""
    q, k, v = _qkv(B, Hq, Hkv, L, D, dtype, gen, peak=1.5)
    knobs = dict(segment_len=seg, block_m=block, block_n=block, local_window=W, q_perm=q_perm,
                 causal=causal)  # fmt: skip
    perms = s2o_permutations(q, k, seg, W, causal)
    tol = 2 * _yardstick(q, k, v, causal) + 1e-5
    has_prefix = L > seg + W if causal else L > seg
    # the reference at each (tau, stop_tile), computed once: the tau search's runs at tau = 0 and
    # at the tau it picks ("keep", the reference's default) are those checked below
    reference = functools.cache(
        lambda tau, stop_tile="keep": s2o_reference(
            q, k, v, tau=tau, perms=perms, stop_tile=stop_tile, **knobs
        )
    )  # fmt: skip
    tau_skip = _unambiguous_tau(q, k, v, perms, knobs, reference=reference) if has_prefix else 0.5
    runs = [(0.0, "keep"), (tau_skip, "keep"), (tau_skip, "discard")]
    outs = {}
    for tau, stop_tile in runs:
        kw = dict(tau=tau, perms=perms, stop_tile=stop_tile, **knobs)
        ref, rst = reference(tau, stop_tile)
        out = torch.full_like(q, float("nan"))
        out, st = s2o_triton(q, k, v, variant=variant, out=out, **kw, **kernel_kw)
        outs[stop_tile] = (out, ref)
        assert not out.isnan().any(), f"tau={tau}: {int(out.isnan().sum())} outputs unwritten"
        err = _rel(out, ref)
        assert err <= tol, (
            f"tau={tau} {stop_tile}: rel err {err:.3e} > tol {tol:.3e} ({dtype}, {variant})"
        )
        got, want = st.extra["pass2_tiles"], rst.extra["pass2_tiles"]
        assert torch.equal(got, want), f"tau={tau}: pass2_tiles\n{got}\nvs reference\n{want}"
        assert torch.equal(st.tiles_processed, rst.tiles_processed)
        assert st.tiles_processed.dtype == torch.float64
        assert torch.equal(st.extra["pass2_tiles_max"], rst.extra["pass2_tiles_max"])
        assert st.extra["pass1_tiles"] == rst.extra["pass1_tiles"]
        assert st.tiles_dense == rst.tiles_dense
    if has_prefix:
        assert st.sparsity > 0, f"tau={tau} skipped nothing: the early-stop path is untested"
        # the two rules must differ where the reference's differ (the kept tile is really added)
        (keep, ref_keep), (drop, ref_drop) = outs["keep"], outs["discard"]
        gap_ref = _rel(ref_keep, ref_drop)
        assert gap_ref > 4 * tol, f"keep and discard references too close ({gap_ref:.2e})"
        assert _rel(keep, drop) > gap_ref / 2, "kernel keep/discard outputs do not differ"
    return outs


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[6]], ids=["2pass-W", "fused-W", "fp32"])
def test_kernels_match_reference_descriptor_loads(case, gen):
    """The dense tiles of Pass-1 and of the fused kernel through TMA tensor descriptors (the
    Hopper path; off by default on the CPU): rows past L, the local window, GQA."""
    _check_kernels(*case, gen, descriptors=True)


def test_descriptors_reject_a_bad_value(gen):
    q, k, v = _qkv(1, 2, 1, 40, 16, torch.float16, gen)
    with pytest.raises(ValueError, match="'yes'"):
        s2o_triton(q, k, v, segment_len=SEG, tau=0.0, block_m=BLOCK, block_n=BLOCK,
                   descriptors="yes")  # fmt: skip


HEAD_DIM_CASES = [
    # dtype, variant, q_perm, B, Hq, Hkv, L, D, W, seg, block, sub_n
    (torch.float16, "two_pass", True, 1, 2, 1, 100, 64, 0, SEG, BLOCK, None),
    (torch.float32, "fused", False, 1, 2, 2, 90, 64, 16, SEG, BLOCK, None),
    (torch.float16, "two_pass", True, 1, 2, 1, 100, 256, 0, SEG, BLOCK, None),
    (torch.float16, "fused", False, 1, 2, 1, 90, 256, 16, SEG, BLOCK, None),
    # 32-key tiles computed in 16-key parts (head_dim 256's sub-tiles on the GPU)
    (torch.float16, "two_pass", True, 1, 2, 1, 150, 256, 0, 64, 32, 16),
    (torch.float32, "fused", False, 1, 2, 1, 140, 64, 32, 64, 32, 16),
]


@pytest.mark.parametrize("case", HEAD_DIM_CASES, ids=lambda c: f"{c[1]}-D{c[7]}-sub{c[11]}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_kernels_match_reference_head_dims(case, causal, gen):
    """Head sizes 64 and 256 (the defaults, and key tiles split into sub-tiles for both stop
    rules), causal and not: the same decisions, statistics and outputs as the reference."""
    *shape, seg, block, sub_n = case
    launch = {name: Launch(sub_n=sub_n) for name in ("pass1", "pass2", "fused")}
    _check_kernels(*shape, gen, seg=seg, block=block, causal=causal, launch=launch)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4], CASES[6]],
                         ids=["2pass", "2pass-noperm", "fused-W", "fp32"])  # fmt: skip
def test_kernels_match_reference_noncausal(case, gen):
    _check_kernels(*case, gen, causal=False)


@pytest.mark.parametrize("D", [24, 96, 512])
def test_kernels_refuse_other_head_dims(D, gen):
    """A head size the kernels do not take is refused before any work, naming it."""
    q, k, v = _qkv(1, 2, 1, 40, D, torch.float16, gen)
    with pytest.raises(ValueError, match=f"got {D}"):
        s2o_triton(q, k, v, segment_len=SEG, tau=0.0, block_m=BLOCK, block_n=BLOCK)


def test_launch_settings_are_checked(gen):
    q, k, v = _qkv(1, 2, 1, 40, 16, torch.float16, gen)
    kw = dict(segment_len=SEG, tau=0.0, block_m=BLOCK, block_n=BLOCK)
    with pytest.raises(ValueError, match="sub_n=24"):
        s2o_triton(q, k, v, launch={"pass2": Launch(sub_n=24)}, **kw)
    with pytest.raises(ValueError, match="'pass3'"):
        s2o_triton(q, k, v, launch={"pass3": Launch()}, **kw)
    with pytest.raises(ValueError, match="stop_chunk"):
        s2o_triton(q, k, v, stop_chunk=(0, 1), **kw)


def test_tau_zero_equals_dense_attention(gen):
    """No early stop: the kernel is exact dense causal attention (checked against fp64)."""
    q, k, v = _qkv(1, 4, 2, 100, 16, torch.float16, gen)
    out, st = s2o_triton(
        q, k, v, variant="two_pass", segment_len=SEG, tau=0.0, block_m=BLOCK, block_n=BLOCK,
        local_window=0, q_perm=True,
    )  # fmt: skip
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
        is_causal=True,
    )  # fmt: skip
    err, tol = _rel(out, ref), 2 * _yardstick(q, k, v)
    assert err <= tol, f"rel err vs dense {err:.3e} > {tol:.3e}"
    assert st.sparsity == 0.0


@pytest.mark.parametrize("chunk,grow", [(1, 0), (3, 0), (1, 2)])
def test_stop_chunk_boundaries(chunk, grow, gen):
    """Walks of up to 8 tiles cross several stop-check chunks: same decisions and outputs as the
    reference under both stop_tile rules (the default chunk covers the whole walk above); the
    kernels read an int32 kv_perm here."""
    q, k, v = _qkv(1, 2, 1, 160, 16, torch.float16, gen, peak=1.5)
    knobs = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, local_window=0, q_perm=True)
    perms = s2o_permutations(q, k, SEG, 0)
    tau = _unambiguous_tau(q, k, v, perms, knobs)
    tol = 2 * _yardstick(q, k, v) + 1e-5
    for variant, qp in (("two_pass", True), ("fused", False)):
        for stop_tile in ("keep", "discard"):
            kw = dict(knobs, q_perm=qp, tau=tau, perms=perms, stop_tile=stop_tile)
            ref, rst = s2o_reference(q, k, v, **kw)
            out = torch.full_like(q, float("nan"))
            kw["perms"] = (perms[0], perms[1].int())  # the kernels take int32 kv_perm too
            out, st = s2o_triton(q, k, v, variant=variant, out=out, stop_chunk=(chunk, grow), **kw)
            got, want = st.extra["pass2_tiles"], rst.extra["pass2_tiles"]
            assert torch.equal(got, want), f"{variant} {stop_tile}:\n{got}\nvs\n{want}"
            assert bool((want > 1).any() & (want < want.max()).any()), "no long/stopped walks"
            err = _rel(out, ref)
            assert err <= tol, f"{variant} {stop_tile}: rel err {err:.3e} > {tol:.3e}"


@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("fused", False)])
@pytest.mark.parametrize("budget", [0, 1, 2])
def test_walk_budget_matches_reference(variant, q_perm, budget, gen):
    q, k, v = _qkv(1, 2, 1, 100, 16, torch.float16, gen, peak=1.5)
    knobs = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, local_window=0, q_perm=q_perm)
    perms = s2o_permutations(q, k, SEG, 0)
    tol = 2 * _yardstick(q, k, v) + 1e-5
    for tau in (0.0, 0.1):
        kw = dict(tau=tau, perms=perms, walk_budget=budget, **knobs)
        ref, rst = s2o_reference(q, k, v, **kw)
        out = torch.full_like(q, float("nan"))
        out, st = s2o_triton(q, k, v, variant=variant, out=out, **kw)
        assert _rel(out, ref) <= tol, f"budget {budget} tau {tau}: {_rel(out, ref):.3e} > {tol:.3e}"
        assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
        assert torch.equal(st.extra["pass2_tiles_max"], rst.extra["pass2_tiles_max"])
        assert torch.equal(st.tiles_processed, rst.tiles_processed)
        assert int(st.extra["pass2_tiles"].max()) <= budget


def test_s2o_method_step1_sort_knob(gen):
    """``step1_sort`` reaches Step 1 through the method interface: the same output for every sort
    (CPU: "cub" sorts its packed keys with torch.sort); a bad value names itself."""
    from s2o import sparse_attention

    q, k, v = _qkv(1, 4, 2, 100, 16, torch.float32, gen)
    knobs = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.01, impl="triton")
    outs = [sparse_attention("s2o", q, k, v, step1_sort=m, **knobs)[0] for m in ("chunks", "cub")]
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="step1_sort"):
        sparse_attention("s2o", q, k, v, step1_sort="bitonic", **knobs)


def test_step1_options_are_validated(gen):
    """A bad sort mode or index dtype is named, also when L < S (no ranking to do)."""
    q, k = _exact((1, 2, 20, 16), gen), _exact((1, 1, 20, 16), gen)
    with pytest.raises(ValueError, match="'bitonic'"):
        s2o_step1(q, k, segment_len=32, sort_mode="bitonic")
    with pytest.raises(ValueError, match="torch.int16"):
        s2o_step1(q, k, segment_len=32, index_dtype=torch.int16)


def test_sub_tiled_walk_across_stop_chunks(gen):
    """Key tiles of 32 in 16-key parts over walks of up to 4 tiles, with one-tile chunks: the
    flat sub-tile loop of the "keep" walk restarts each tile's gain at its first part and decides
    at chunk ends exactly as the reference (the default chunking: the head-size cases)."""
    chunk = (1, 0)
    launch = {name: Launch(sub_n=16) for name in ("pass2", "fused")}
    # L = 224: 7 key tiles, walks of up to 6 (dense) and stopped walks of 2 to 5 tiles
    _check_kernels(torch.float16, "two_pass", True, 1, 2, 1, 224, 32, 0, gen, seg=64, block=32,
                   launch=launch, stop_chunk=chunk)  # fmt: skip
    _check_kernels(torch.float16, "fused", False, 1, 2, 1, 224, 32, 0, gen, seg=64, block=32,
                   launch=launch, stop_chunk=chunk)  # fmt: skip


SUBTILE_CASES = [
    # dtype, variant, q_perm, B, Hq, Hkv, L, D, W, seg, block, sub_n, stop_chunk
    (torch.float16, "two_pass", True, 1, 2, 1, 520, 256, 0, 128, 128, 64, None),  # the GPU's split
    (torch.float16, "fused", False, 1, 2, 1, 450, 256, 0, 128, 128, 64, None),  # last part: 2 keys
    (torch.float32, "two_pass", True, 1, 2, 1, 200, 32, 0, 64, 32, 16, (1, 0)),  # walks up to 6
    (torch.float16, "fused", False, 1, 4, 2, 300, 32, 16, 64, 32, 16, (1, 1)),  # GQA 2
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("case", SUBTILE_CASES, ids=lambda c: f"{c[1]}-D{c[7]}-sub{c[11]}")
def test_sub_tiled_keep_walk_matches_reference(case, causal, monkeypatch):
    """The "keep" walk over key sub-tiles against the reference, with the stop-rule control flow on
    at tau = 0 too: the same decisions (visits). (The walks it won its GPU A/B against, and the
    test of its outputs against theirs, were removed with them.)"""
    import s2o.kernels as kernels
    from s2o.kernels import s2o_attention

    *shape, seg, block, sub_n, chunk = case
    launch = {name: Launch(sub_n=sub_n) for name in ("pass1", "pass2", "fused")}
    for name in ("s2o_pass2", "s2o_fused"):
        fn = functools.partial(getattr(s2o_attention, name), early_stop=True)
        monkeypatch.setattr(kernels, name, fn)
    gen = torch.Generator().manual_seed(1234)
    _check_kernels(*shape, gen, seg=seg, block=block, causal=causal, launch=launch,
                   stop_chunk=chunk)  # fmt: skip


TOPK_CASES = [
    # dtype, variant, q_perm, B, Hq, Hkv, L, D, W
    (torch.float16, "two_pass", True, 1, 2, 1, 100, 64, 0),  # last segment of 4 rows
    (torch.float16, "two_pass", False, 2, 2, 2, 77, 128, 16),  # batch 2, window, original order
    (torch.float16, "fused", False, 1, 4, 1, 90, 64, 16),  # GQA 4
    (torch.float32, "fused", False, 1, 2, 1, 70, 128, 0),
    (torch.float32, "two_pass", True, 1, 2, 1, 20, 64, 0),  # L < S and L < block: nothing ranked
    (torch.float16, "two_pass", True, 1, 2, 1, 100, 256, 0),  # head_dim 256
    (torch.float16, "fused", False, 1, 2, 1, 90, 256, 16),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("case", TOPK_CASES, ids=lambda c: f"{c[1]}-qp{int(c[2])}-L{c[6]}-D{c[7]}")
def test_topk_kernels_match_reference(case, causal, gen):
    """The top-k mode (no early stop, the first ceil(r x ranked tiles) key tiles): the same visits,
    statistics and outputs as the reference, for two ratios (the visits must differ)."""
    dtype, variant, q_perm, B, Hq, Hkv, L, D, W = case
    q, k, v = _qkv(B, Hq, Hkv, L, D, dtype, gen, peak=1.5)
    perms = s2o_permutations(q, k, SEG, W, causal)
    tol = 2 * _yardstick(q, k, v, causal) + 1e-5
    visits = []
    for ratio in (0.3, 0.7):
        kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, local_window=W, q_perm=q_perm,
                  causal=causal, tau=0.0, perms=perms, topk_ratio=ratio)  # fmt: skip
        ref, rst = s2o_reference(q, k, v, **kw)
        out = torch.full_like(q, float("nan"))
        out, st = s2o_triton(q, k, v, variant=variant, out=out, **kw)
        assert not out.isnan().any(), f"ratio {ratio}: {int(out.isnan().sum())} outputs unwritten"
        err = _rel(out, ref)
        assert err <= tol, f"ratio {ratio}: rel err {err:.3e} > tol {tol:.3e}"
        got, want = st.extra["pass2_tiles"], rst.extra["pass2_tiles"]
        assert torch.equal(got, want), f"ratio {ratio}: pass2_tiles\n{got}\nvs reference\n{want}"
        most = st.extra["pass2_tiles_max"].expand_as(got)
        assert torch.equal(got, most), "a walk stopped early"
        assert torch.equal(st.tiles_processed, rst.tiles_processed)
        assert st.extra["topk_ratio"] == rst.extra["topk_ratio"] == ratio
        visits.append(got)
    ranked = L > SEG + W if causal else L > SEG
    if ranked:
        assert bool((visits[0] < visits[1]).any()), "ratios 0.3 and 0.7 walked the same tiles"


def test_topk_kernels_refuse_early_stop(gen):
    q, k, v = _qkv(1, 2, 1, 64, 16, torch.float16, gen)
    with pytest.raises(ValueError, match=r"topk_ratio=0\.5 .*tau must be <= 0, got tau=0\.01"):
        s2o_triton(q, k, v, segment_len=SEG, tau=0.01, block_m=BLOCK, block_n=BLOCK,
                   topk_ratio=0.5)  # fmt: skip


def test_topk_method_triton_path_equals_reference_path(gen):
    """``topk_ratio`` reaches the kernels through the method interface (non-causal, fp32)."""
    from s2o import sparse_attention

    q, k, v = _qkv(1, 4, 2, 100, 64, torch.float32, gen)
    knobs = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.0, topk_ratio=0.2,
                 causal=False)  # fmt: skip
    out, st = sparse_attention("s2o", q, k, v, impl="triton", **knobs)
    ref, rst = sparse_attention("s2o", q, k, v, impl="reference", **knobs)
    assert _rel(out, ref) <= 2 * _yardstick(q, k, v, causal=False) + 1e-5
    assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    assert st.sparsity == rst.sparsity > 0


@pytest.mark.parametrize("variant", ["two_pass", "fused"])
def test_topk_sub_tiled_walk_matches_reference(variant, gen):
    """The top-k walk with key tiles computed in parts (head_dim 256's sub-tiles on the GPU: here
    32-key tiles in 16-key parts): the key cap falls on a tile boundary, never inside a part."""
    seg, block = 64, 32
    q, k, v = _qkv(1, 2, 1, 230, 256, torch.float16, gen, peak=1.5)
    perms = s2o_permutations(q, k, seg, 0, False)
    launch = {name: Launch(sub_n=16) for name in ("pass2", "fused")}
    kw = dict(segment_len=seg, block_m=block, block_n=block, q_perm=variant == "two_pass",
              causal=False, tau=0.0, perms=perms, topk_ratio=0.4)  # fmt: skip
    ref, rst = s2o_reference(q, k, v, **kw)
    out = torch.full_like(q, float("nan"))
    out, st = s2o_triton(q, k, v, variant=variant, out=out, launch=launch, **kw)
    assert not out.isnan().any()
    assert _rel(out, ref) <= 2 * _yardstick(q, k, v, causal=False) + 1e-5
    assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    assert 0 < st.sparsity == rst.sparsity
