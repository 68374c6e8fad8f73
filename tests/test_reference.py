"""The S2O reference against a per-query oracle and against dense SDPA."""

import pytest
import torch
from s2o_oracle import oracle_s2o, structured_qkv

from s2o import dense_causal_tile_count, s2o_attention
from s2o.reference import s2o_permutations, s2o_reference


def dense_truth(q, k, v):
    """Dense causal attention in float64 with K/V repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k, v, is_causal=True)


def sdpa_same_dtype(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def assert_dense(out, q, k, v, what=""):
    """Error vs float64 truth within 2x the same-dtype SDPA error (plus fp32 rounding slack)."""
    truth = dense_truth(q, k, v)
    ref_err = (out.double() - truth).abs().max().item()
    sdpa_err = (sdpa_same_dtype(q, k, v).double() - truth).abs().max().item()
    assert ref_err <= 2 * sdpa_err + 1e-6, (
        f"{what} {q.dtype}: reference err {ref_err:.3e} > 2 x SDPA err {sdpa_err:.3e}"
    )


def local_only_attention(q, k, v, S, W):
    """Float64 attention over the local window and the causal part of the own segment only."""
    L, group = q.shape[2], q.shape[1] // k.shape[1]
    pos = torch.arange(L)
    lo = (pos // S * S - W).clamp(min=0)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= lo[:, None])
    kr, vr = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kr, vr, attn_mask=allowed)
    return want, allowed


def run_ref(q, k, v, **kw):
    return s2o_attention(q, k, v, impl="reference", return_stats=True, **kw)


ORACLE_CASES = [
    # (B, Hq, Hkv, L, D, S, bm, bn, W, tau, q_perm)
    (1, 2, 1, 96, 8, 32, 16, 16, 0, 0.05, True),
    (2, 4, 2, 77, 8, 32, 16, 8, 0, 0.02, True),
    (1, 2, 2, 70, 8, 16, 8, 16, 16, 0.1, True),
    (1, 4, 1, 64, 16, 32, 32, 32, 0, 0.01, False),
    (1, 1, 1, 100, 8, 32, 16, 16, 32, 0.0, True),
    (1, 2, 1, 20, 8, 32, 16, 16, 0, 0.05, True),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("stop_tile", ["keep", "discard"])
@pytest.mark.parametrize("case", ORACLE_CASES)
def test_reference_matches_oracle(case, stop_tile, causal):
    B, Hq, Hkv, L, D, S, bm, bn, W, tau, qp = case
    q, k, v = structured_qkv(B, Hq, Hkv, L, D, seed=L + D)
    knobs = dict(segment_len=S, tau=tau, block_m=bm, block_n=bn, local_window=W,
                 stop_tile=stop_tile, causal=causal)  # fmt: skip
    out, stats = run_ref(q, k, v, q_perm=qp, **knobs)
    want, visited, orders = oracle_s2o(q, k, v, q_perm=qp, **knobs)
    q_idx, kv_idx = s2o_permutations(q, k, S, W, causal)
    assert stats.extra["pass2_tiles"].numel() > 0
    for (b, h), (q_orders, kv_orders) in orders.items():
        assert q_idx[b, h].tolist() == [i for seg in q_orders for i in seg], (b, h)
        for n, kv_order in enumerate(kv_orders):
            assert kv_idx[b, h, n, : len(kv_order)].tolist() == kv_order, (b, h, n)
        assert stats.extra["pass2_tiles"][b, h].tolist() == visited[(b, h)], (b, h)
    err = (out.double() - want).abs().max().item()
    assert err < 2e-5, f"reference vs oracle max abs error {err:.3e}"


def test_oracle_cases_exercise_early_stop():
    """Guard against an oracle test that passes because nothing ever stops."""
    B, Hq, Hkv, L, D, S, bm, bn, W, tau, qp = ORACLE_CASES[0]
    q, k, v = structured_qkv(B, Hq, Hkv, L, D, seed=L + D)
    _, stats = run_ref(q, k, v, segment_len=S, tau=tau, block_m=bm, block_n=bn)
    pass2, most = stats.extra["pass2_tiles"], stats.extra["pass2_tiles_max"]
    assert bool((pass2 < most).any()), f"no query tile stopped early: {pass2.tolist()}"
    assert stats.sparsity > 0


SDPA_CASES = [
    # (B, Hq, Hkv, L, D, S, bm, bn, W)
    (1, 2, 2, 1000, 64, 256, 64, 64, 0),
    (1, 8, 2, 333, 32, 64, 32, 16, 32),
    (2, 8, 1, 200, 64, 64, 32, 32, 0),
    (1, 4, 4, 50, 128, 64, 32, 32, 0),
]


@pytest.mark.parametrize("case", SDPA_CASES)
@pytest.mark.parametrize("tau", [0.0, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tau_nonpositive_is_dense_causal(case, tau, dtype):
    B, Hq, Hkv, L, D, S, bm, bn, W = case
    q, k, v = structured_qkv(B, Hq, Hkv, L, D, seed=7, dtype=dtype)
    out, stats = run_ref(q, k, v, segment_len=S, tau=tau, block_m=bm, block_n=bn, local_window=W)
    assert out.dtype == dtype and out.shape == q.shape
    assert_dense(out, q, k, v, f"case {case} tau {tau}")
    assert stats.sparsity == 0.0, stats.sparsity


@pytest.mark.slow
def test_long_awkward_length_dense():
    q, k, v = structured_qkv(1, 4, 1, 4001, 64, seed=3)
    out, stats = run_ref(q, k, v, segment_len=512, tau=0.0, block_m=128, block_n=64)
    assert_dense(out, q, k, v, "L=4001")
    assert stats.sparsity == 0.0


def test_sequence_shorter_than_segment():
    q, k, v = structured_qkv(2, 4, 2, 37, 16, seed=5)
    out, stats = run_ref(q, k, v, segment_len=64, tau=0.5, block_m=16, block_n=16)
    assert_dense(out, q, k, v, "L < S has no prefix, so S2O is dense:")
    assert stats.sparsity == 0.0


def test_sparsity_nondecreasing_in_tau():
    q, k, v = structured_qkv(1, 4, 2, 512, 32, seed=11, heavy=10)
    prev = None
    for tau in [0.0, 1e-3, 5e-3, 1e-2, 5e-2, 0.2, 1.0]:
        _, stats = run_ref(q, k, v, segment_len=64, tau=tau, block_m=32, block_n=32)
        cur = stats.sparsity_per_head
        if prev is not None:
            assert bool((cur >= prev).all()), f"tau={tau}: {cur.tolist()} < {prev.tolist()}"
        prev = cur
    assert float(prev.mean()) > 0.5, f"tau=1 should skip most prefix tiles, got {prev.tolist()}"


def test_error_grows_with_tau():
    q, k, v = structured_qkv(1, 4, 2, 512, 32, seed=12)
    truth = dense_truth(q, k, v)
    errs = []
    for tau in [1e-3, 1e-2, 1e-1]:
        out, _ = run_ref(q, k, v, segment_len=64, tau=tau, block_m=32, block_n=32)
        errs.append(((out.double() - truth) ** 2).mean().item())
    assert errs[0] <= errs[1] <= errs[2], errs
    assert errs[2] > 0


@pytest.mark.parametrize("group", [1, 4, 8])
def test_q_perm_does_not_change_dense_output(group):
    q, k, v = structured_qkv(1, 8, 8 // group, 300, 32, seed=group)
    kw = dict(segment_len=64, tau=0.0, block_m=32, block_n=32)
    a, _ = run_ref(q, k, v, q_perm=True, **kw)
    b, _ = run_ref(q, k, v, q_perm=False, **kw)
    assert (a - b).abs().max().item() < 1e-6


def test_fused_equals_two_pass_without_q_perm():
    q, k, v = structured_qkv(1, 4, 2, 300, 32, seed=21)
    kw = dict(segment_len=64, tau=0.02, block_m=32, block_n=32, local_window=32)
    a, sa = run_ref(q, k, v, variant="fused", **kw)
    b, sb = run_ref(q, k, v, variant="two_pass", q_perm=False, **kw)
    assert torch.equal(a, b)
    assert torch.equal(sa.tiles_processed, sb.tiles_processed)


def test_q_perm_changes_decisions_when_sparse():
    q, k, v = structured_qkv(1, 4, 2, 512, 32, seed=22)
    kw = dict(segment_len=128, tau=0.02, block_m=32, block_n=32)
    _, sa = run_ref(q, k, v, q_perm=True, **kw)
    _, sb = run_ref(q, k, v, q_perm=False, **kw)
    assert not torch.equal(sa.extra["pass2_tiles"], sb.extra["pass2_tiles"])


def test_huge_tau_keeps_only_window_and_own_segment():
    """Every walk stops at its first prefix tile, which is discarded: the local-window-only case."""
    L, S, W = 256, 64, 32
    q, k, v = structured_qkv(1, 2, 1, L, 16, seed=4)
    kw = dict(segment_len=S, tau=1e9, block_m=32, block_n=16, local_window=W, stop_tile="discard")
    out, stats = run_ref(q, k, v, **kw)
    want, allowed = local_only_attention(q, k, v, S, W)
    assert (out.double() - want).abs().max().item() < 1e-5
    pass2, most = stats.extra["pass2_tiles"], stats.extra["pass2_tiles_max"]
    assert torch.equal(pass2, torch.minimum(most, torch.ones_like(most)).expand_as(pass2))


def test_permutations_are_valid_and_causal():
    L, S, W = 150, 32, 32
    q, k, _ = structured_qkv(2, 4, 2, L, 16, seed=9)
    q_idx, kv_idx = s2o_permutations(q, k, S, W)
    assert q_idx.shape == (2, 4, L) and kv_idx.shape == (2, 4, 5, 128 - W)
    for s in range(0, L, S):
        e = min(s + S, L)
        got = q_idx[..., s:e].sort(dim=-1).values
        assert torch.equal(got, torch.arange(s, e).expand_as(got))
    for n, s in enumerate(range(0, L, S)):
        p = max(0, s - W)
        row = kv_idx[:, :, n]
        assert torch.equal(row[..., :p].sort(dim=-1).values, torch.arange(p).expand(2, 4, p))
        assert bool((row[..., p:] == -1).all())


def test_ties_keep_ascending_token_order():
    q = torch.ones(1, 1, 32, 4)
    k = torch.ones(1, 1, 32, 4)
    q_idx, kv_idx = s2o_permutations(q, k, 8)
    assert q_idx[0, 0].tolist() == list(range(32))
    assert kv_idx[0, 0, 3].tolist() == list(range(24))


def test_stats_shapes_and_dense_count():
    q, k, v = structured_qkv(2, 4, 2, 100, 16, seed=1)
    _, stats = run_ref(q, k, v, segment_len=32, tau=0.05, block_m=16, block_n=8)
    assert isinstance(stats.sparsity, float)
    assert stats.sparsity_per_head.shape == (2, 4)
    assert stats.tiles_dense == dense_causal_tile_count(100, 16, 8)
    assert stats.extra["pass2_tiles"].shape == (2, 4, 7)


@pytest.mark.parametrize("L,bm,bn", [(1, 16, 16), (100, 16, 8), (128, 32, 64), (257, 64, 32)])
def test_dense_tile_count_matches_brute_force(L, bm, bn):
    want = 0
    for a in range(0, L, bm):
        for c in range(0, L, bn):
            if c <= min(a + bm, L) - 1:
                want += 1
    assert dense_causal_tile_count(L, bm, bn) == want


def test_reference_is_the_direct_function():
    q, k, v = structured_qkv(1, 2, 1, 64, 8, seed=2)
    kw = dict(segment_len=32, tau=0.05, block_m=16, block_n=16)
    a = s2o_attention(q, k, v, impl="reference", **kw)
    b, _ = s2o_reference(q, k, v, local_window=0, q_perm=True, scale=None, **kw)
    assert torch.equal(a, b)


def test_stop_tile_keep_and_discard_make_the_same_decisions():
    q, k, v = structured_qkv(1, 4, 2, 512, 32, seed=31)
    kw = dict(segment_len=128, tau=0.02, block_m=32, block_n=32)
    keep, sk = run_ref(q, k, v, stop_tile="keep", **kw)
    drop, sd = run_ref(q, k, v, stop_tile="discard", **kw)
    assert torch.equal(sk.extra["pass2_tiles"], sd.extra["pass2_tiles"])
    assert sk.sparsity == sd.sparsity > 0
    truth = dense_truth(q, k, v)
    err_keep = ((keep.double() - truth) ** 2).mean().item()
    err_drop = ((drop.double() - truth) ** 2).mean().item()
    assert err_keep < err_drop, f"keeping the computed tile should help: {err_keep} vs {err_drop}"


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_walk_budget_matches_oracle(budget):
    q, k, v = structured_qkv(1, 2, 1, 96, 8, seed=41)
    knobs = dict(segment_len=32, tau=0.02, block_m=16, block_n=16, walk_budget=budget)
    out, stats = run_ref(q, k, v, **knobs)
    want, visited, _ = oracle_s2o(q, k, v, **knobs)
    for (b, h), tiles in visited.items():
        assert stats.extra["pass2_tiles"][b, h].tolist() == tiles
    assert bool((stats.extra["pass2_tiles"] <= budget).all())
    assert (out.double() - want).abs().max().item() < 2e-5


def test_walk_budget_zero_is_local_window_only_with_exact_counts():
    L, S, W, bm, bn = 256, 64, 32, 32, 16
    q, k, v = structured_qkv(1, 2, 1, L, 16, seed=4)
    kw = dict(segment_len=S, tau=0.0, block_m=bm, block_n=bn, local_window=W, walk_budget=0)
    out, stats = run_ref(q, k, v, **kw)
    want, allowed = local_only_attention(q, k, v, S, W)
    assert (out.double() - want).abs().max().item() < 1e-5
    assert int(stats.extra["pass2_tiles"].sum()) == 0
    # only the tiles touching allowed (query, key) pairs are computed
    want_tiles = sum(
        bool(allowed[a : a + bm, c : c + bn].any())
        for a in range(0, L, bm)
        for c in range(0, L, bn)
    )
    assert stats.tiles_processed[0, 0].item() == want_tiles


@pytest.mark.parametrize("case", SDPA_CASES[:3])
def test_noncausal_tau_nonpositive_is_dense(case):
    """Non-causal, tau <= 0: exact dense attention over every key; counts against the dense
    non-causal tiles (sparsity 0)."""
    B, Hq, Hkv, L, D, S, bm, bn, W = case
    q, k, v = structured_qkv(B, Hq, Hkv, L, D, seed=5)
    out, stats = run_ref(q, k, v, segment_len=S, tau=0.0, block_m=bm, block_n=bn,
                         local_window=W, causal=False)  # fmt: skip
    group = Hq // Hkv
    kr, vr = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kr, vr)
    same = torch.nn.functional.scaled_dot_product_attention(q, kr.float(), vr.float())
    err = (out.double() - want).abs().max().item()
    tol = 2 * (same.double() - want).abs().max().item() + 1e-6
    assert err <= tol, f"non-causal reference vs dense: {err:.3e} > {tol:.3e}"
    assert stats.sparsity == 0.0 and stats.tiles_dense == -(-L // bm) * -(-L // bn)


def test_noncausal_permutations_rank_every_key_outside_the_segment():
    q, k, _ = structured_qkv(1, 2, 1, 70, 8, seed=3)
    S, W = 16, 8
    _, kv = s2o_permutations(q, k, S, W, causal=False)
    for n, s in enumerate(range(0, 70, S)):
        lo, e = max(0, s - W), min(s + S, 70)
        want = sorted(set(range(70)) - set(range(lo, e)))
        row = kv[0, 1, n]
        assert sorted(row[: len(want)].tolist()) == want
        assert bool((row[len(want) :] == -1).all())
