"""``tail_rank`` (a named S2O variant, :mod:`s2o.tail_rank`): T=0 changes nothing, the reference
against a per-row float64 loop, Step 1 and the Triton kernels against the reference
(interpreter), a synthetic needle the default misses and the variant finds at a fraction of
``dense_tail``'s extra density, evidence coverage, and the refusals."""

import math

import pytest
import torch

from eval.evidence import Evidence, EvidenceProbe
from s2o import s2o_attention, sparse_attention
from s2o.dense_tail import tail_last
from s2o.methods import bind
from s2o.reference import s2o_permutations, s2o_reference
from s2o.tail_rank import kv_rows, tail_rows, tail_tiles

SEG, BLOCK = 32, 16


def _qkv(L, D=16, Hq=4, Hkv=2, seed=0, dtype=torch.float32, B=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=gen) * 1.5
    k = torch.randn(B, Hkv, L, D, generator=gen)
    v = torch.randn(B, Hkv, L, D, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _exact(shape, gen):
    """Multiples of 1/4: fp32 dot products and power-of-two means are exact (ties occur)."""
    return torch.randint(-8, 9, shape, generator=gen).float() / 4


def _oracle(q, k, v, *, S, T, tau, bm, bn, q_perm=True, W=0):
    """Python loops in float64: Step 1 by sorting lists (the tail rows last in their segment;
    each segment's tail ranks the prefix by its own mean query), then per query tile a walk of
    its ranking (the tail's if the tile holds a tail slot) with the tile-level stop rule
    (``"keep"``) and an exact softmax over the accepted keys. Returns ``(out, visited)``."""
    B, Hq, L, D = q.shape
    group = Hq // k.shape[1]
    start = max(0, L - T)
    out = torch.zeros(B, Hq, L, D, dtype=torch.float64)
    visited = torch.zeros(B, Hq, sum(-(-(min(s + S, L) - s) // bm) for s in range(0, L, S)),
                          dtype=torch.long)  # fmt: skip
    for b in range(B):
        for h in range(Hq):
            kv = h // group
            qd, kd, vd = q[b, h].double(), k[b, kv].double(), v[b, kv].double()
            w = torch.exp(qd @ kd.T / math.sqrt(D))
            guide = kd[: min(S, L)].mean(0)
            n_tile = 0
            for s in range(0, L, S):
                e, lo = min(s + S, L), max(0, s - W)
                order = list(range(s, e))
                if q_perm:
                    order.sort(key=lambda i: (-float(qd[i] @ guide), i))
                order = [i for i in order if i < start] + [i for i in range(s, e) if i >= start]

                def ranking(rows, lo=lo, qd=qd, kd=kd):
                    m = qd[list(rows)].mean(0)
                    return sorted(range(lo), key=lambda t: (-float(kd[t] @ m), t))

                own = ranking(range(s, e))
                tail = ranking(range(max(s, start), e)) if e > start else None
                for a in range(0, e - s, bm):
                    rows = order[a : a + bm]
                    ranked = tail if s + min(a + bm, e - s) > start else own
                    got = {r: list(range(lo, r + 1)) for r in rows}
                    for j in range(0, len(ranked), bn):
                        keys = ranked[j : j + bn]
                        visited[b, h, n_tile] += 1
                        gains = [float(w[r, keys].sum()) >= tau * float(w[r, got[r]].sum())
                                 for r in rows]  # fmt: skip
                        for r in rows:
                            got[r] += keys
                        if tau > 0 and not any(gains):
                            break
                    n_tile += 1
                    for r in rows:
                        p = w[r, got[r]]
                        out[b, h, r] = (p / p.sum()) @ vd[got[r]]
    return out, visited


# -- T = 0 is the paper's method, byte for byte ---------------------------------------------


def test_zero_changes_nothing():
    q, k, v = _qkv(150)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.3)
    base = s2o_permutations(q, k, SEG, 8)
    zero = s2o_permutations(q, k, SEG, 8, tail_rank=0)
    assert all(torch.equal(a, b) for a, b in zip(base, zero))
    out0, st0 = s2o_reference(q, k, v, local_window=8, **kw)
    out1, st1 = s2o_reference(q, k, v, local_window=8, tail_rank=0, **kw)
    assert torch.equal(out0, out1)
    assert torch.equal(st0.extra["pass2_tiles"], st1.extra["pass2_tiles"])
    assert torch.equal(st0.tiles_processed, st1.tiles_processed)
    a, b = bind("s2o", impl="reference", **kw), bind("s2o", impl="reference", tail_rank=0, **kw)
    pa, pb = a.estimate(q, k, v), b.estimate(q, k, v)
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert torch.equal(a.attend(q, k, v, pa)[0], b.attend(q, k, v, pb)[0])


# -- Step 1 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("L,T", [(100, 4), (100, 36), (150, 20), (96, 200)])
def test_permutations_layout(L, T):
    """q_perm is dense_tail's tail ordering; kv_perm's first N rows are the default's; one tail
    row per segment holding tail rows, ranked by those rows' own mean query."""
    q, k, _ = _qkv(L, seed=2)
    qp0, kvp0 = s2o_permutations(q, k, SEG, 8)
    qp, kvp = s2o_permutations(q, k, SEG, 8, tail_rank=T)
    N = -(-L // SEG)
    n0, n_tail = tail_rows(L, SEG, T)
    assert n0 + n_tail == N and kvp.shape == (*kvp0.shape[:2], N + n_tail, kvp0.shape[-1])
    assert torch.equal(qp, tail_last(qp0, SEG, T))
    assert torch.equal(kvp[:, :, :N], kvp0)
    start = max(0, L - T)
    for j, n in enumerate(range(n0, N)):
        s, e = n * SEG, min(n * SEG + SEG, L)
        P = max(0, s - 8)
        for h in range(4):
            m = q[0, h, max(s, start) : e].double().mean(0)
            kd = k[0, h // 2].double()
            want = sorted(range(P), key=lambda t: (-float(kd[t] @ m), t))
            got = kvp[0, h, N + j].tolist()
            assert got[:P] == want and all(x == -1 for x in got[P:])


def test_kv_rows_and_tail_tiles():
    # L=100, S=32, block 16, T=10: tail slots [90, 100): segment [64, 96)'s local tile 1, and
    # segment [96, 100)
    slots = torch.arange(100)
    rows = kv_rows(slots, 100, SEG, BLOCK, 10)
    n_tail = tail_rows(100, SEG, 10)[1]
    assert n_tail == 2
    want = slots // SEG
    want[80:96] += n_tail  # the tile [80, 96) holds slots 90..95
    want[96:] += n_tail
    assert torch.equal(rows, want)
    assert torch.equal(kv_rows(slots, 100, SEG, BLOCK, 0), slots // SEG)
    assert list(tail_tiles(64, 32, BLOCK, 100, 10)) == [1]
    assert list(tail_tiles(0, 32, BLOCK, 100, 10)) == []


# -- the reference against the loop --------------------------------------------------------


@pytest.mark.parametrize(
    "L,T,Hq,Hkv,W,q_perm",
    [(150, 20, 4, 2, 0, True), (150, 20, 4, 2, 0, False), (100, 36, 2, 2, 8, True),
     (77, 3, 8, 1, 0, True), (96, 96, 4, 1, 0, True), (40, 12, 2, 1, 0, True)],
)  # fmt: skip
def test_reference_equals_loop(L, T, Hq, Hkv, W, q_perm):
    q, k, v = _qkv(L, Hq=Hq, Hkv=Hkv, seed=L + T)
    tau = 0.3
    out, st = s2o_reference(q, k, v, segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=tau,
                            local_window=W, q_perm=q_perm, tail_rank=T)  # fmt: skip
    want, visited = _oracle(q, k, v, S=SEG, T=T, tau=tau, bm=BLOCK, bn=BLOCK, q_perm=q_perm, W=W)
    assert torch.equal(st.extra["pass2_tiles"], visited), (st.extra["pass2_tiles"], visited)
    err = float((out.double() - want).abs().max())
    assert err < 1e-5, err


def test_reference_tau_zero_is_dense():
    """No early stop: every ranking covers the whole prefix, so the output is dense attention
    and the walks are the default's."""
    q, k, v = _qkv(130)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.0)
    a, sa = s2o_reference(q, k, v, **kw)
    b, sb = s2o_reference(q, k, v, tail_rank=40, **kw)
    assert float((a - b).abs().max()) < 1e-5
    assert torch.equal(sa.extra["pass2_tiles"], sb.extra["pass2_tiles"])


# -- the needle: found by the tail's own ranking ------------------------------------------------


def _needle(L=256, D=16, pos=10, n_q=8, seed=0):
    """A haystack whose queries and keys share a direction ``w`` (the segment mean follows it, so
    every prefix key outranks the needle) and question rows (the last ``n_q``) that read only the
    needle, key ``pos``, along ``u``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, L, D, generator=gen) * 0.3
    k = torch.randn(1, 1, L, D, generator=gen) * 0.3
    v = torch.randn(1, 1, L, D, generator=gen)
    u, w = torch.eye(D)[0], torch.eye(D)[1]
    q += 4 * w
    k += 2 * w
    k[0, 0, pos] = 6 * u
    rows = torch.arange(L - n_q, L)
    q[0, :, rows] = 6 * u
    keys = torch.zeros(L, dtype=torch.bool)
    keys[pos] = True
    return q, k, v, Evidence(keys, rows, [(pos, pos + 1)])


NEEDLE = dict(segment_len=64, block_m=16, block_n=16, tau=0.3, impl="reference")


def _probe(knobs):
    q, k, v, ev = _needle()
    bound = bind("s2o", **NEEDLE, **knobs)
    plan = bound.estimate(q, k, v)
    _, stats = bound.attend(q, k, v, plan)
    probe = EvidenceProbe()
    probe.start(ev)
    probe(0, q, k, plan, stats, None, bound)
    return probe.summary(), stats


def test_needle_found_at_a_fraction_of_dense_tails_cost():
    default, sd = _probe({})
    dense, sdt = _probe(dict(dense_tail=8))
    own, st = _probe(dict(tail_rank=8))
    assert min(default["mass"][0]) > 0.9  # the question reads the needle
    assert default["evidence_recall"] == pytest.approx(0.0, abs=1e-6)  # ranked last, not walked
    assert default["s2o"]["rank_segment_mean"][0] == [pytest.approx(0.995, abs=0.01)] * 2
    assert dense["evidence_recall"] == pytest.approx(1.0, abs=1e-6)
    assert own["evidence_recall"] == pytest.approx(1.0, abs=1e-6)
    # the tail's own order ranks the needle first, and the diagnostics read that order
    assert own["s2o"]["rank_segment_mean"][0] == [0.0, 0.0]
    # the question's tile: 12 ranked tiles; dense_tail walks all, tail_rank stops early
    assert sdt.extra["pass2_tiles"][0, :, -1].tolist() == [12, 12]
    assert max(st.extra["pass2_tiles"][0, :, -1].tolist()) <= 4
    extra_dense, extra_own = sdt.density - sd.density, st.density - sd.density
    assert 0 <= extra_own < 0.25 * extra_dense, (sd.density, sdt.density, st.density)


def test_coverage_reproduces_the_output():
    """The keys ``coverage`` reports for tail rows (read from the tail's own ranking) are the keys
    the output was computed from (as tests/test_evidence.py checks for the default)."""
    q, k, v = _qkv(160, seed=4)
    # tau 1: the walks stop early, so which order a row walked decides its keys
    bound = bind("s2o", segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=1.0, impl="reference",
                 tail_rank=40)  # fmt: skip
    plan = bound.estimate(q, k, v)
    out, stats = bound.attend(q, k, v, plan)
    L = 160
    rows = torch.tensor([0, 40, 100, 119, 120, 130, 150, L - 1])
    cov = bound.coverage(plan, stats, rows, L)
    kk, vv = (t.double().repeat_interleave(2, 1) for t in (k, v))
    s = (q[:, :, rows].double() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    want = torch.softmax(s.masked_fill(~cov, float("-inf")), -1) @ vv
    assert float((out[:, :, rows].double() - want).abs().max()) < 1e-4
    # the segment's own ranking would give other keys for the tail rows
    wrong = bound.method.coverage((plan[0], plan[1][:, :, :5]), stats, rows, L,
                                  **{**bound.knobs, "tail_rank": 0})  # fmt: skip
    assert not torch.equal(wrong[:, :, -4:], cov[:, :, -4:])


# -- refusals ----------------------------------------------------------------------------------


def test_refusals_name_the_value():
    q, k, v = _qkv(64)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, impl="reference")
    with pytest.raises(ValueError, match=r"tail_rank must be an int >= 0.*-1"):
        s2o_attention(q, k, v, tail_rank=-1, **kw)
    with pytest.raises(ValueError, match=r"tail_rank must be an int >= 0.*True"):
        sparse_attention("s2o", q, k, v, tail_rank=True, **kw)
    with pytest.raises(ValueError, match=r"tail_rank must be an int >= 0.*2\.0"):
        sparse_attention("s2o", q, k, v, tail_rank=2.0, **kw)
    with pytest.raises(ValueError, match=r"tail_rank=8 .*dense_tail=8.*pick one"):
        s2o_attention(q, k, v, tail_rank=8, dense_tail=8, **kw)
    with pytest.raises(ValueError, match=r"tail_rank=8 .*dense_tail=8"):
        sparse_attention("s2o", q, k, v, tail_rank=8, dense_tail=8, **kw)
    with pytest.raises(ValueError, match=r"tail_rank=8 .*causal=False"):
        s2o_attention(q, k, v, tail_rank=8, causal=False, **kw)
    with pytest.raises(ValueError, match=r"tail_rank=8 .*causal=False"):
        sparse_attention("s2o", q, k, v, tail_rank=8, causal=False, **kw)


def test_allowed_with_walk_budget_and_topk():
    """A cap applies to the tail's walk of its own ranking as to every other tile's."""
    q, k, v = _qkv(130)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tail_rank=20, impl="reference")
    _, st = s2o_attention(q, k, v, tau=0.0, topk_ratio=0.5, return_stats=True, **kw)
    _, st0 = s2o_attention(q, k, v, tau=0.0, topk_ratio=0.5, return_stats=True,
                           **{**kw, "tail_rank": 0})  # fmt: skip
    assert torch.equal(st.extra["pass2_tiles"], st0.extra["pass2_tiles"])
    _, st = s2o_attention(q, k, v, tau=0.3, walk_budget=1, return_stats=True, **kw)
    assert int(st.extra["pass2_tiles"].max()) == 1


# -- the Triton kernels (interpreter) ------------------------------------------------------------


@pytest.mark.interpreter
@pytest.mark.parametrize("L,T,W", [(100, 4, 0), (100, 36, 8), (160, 16, 0), (160, 48, 32)])
@pytest.mark.parametrize("mode", ["chunks", "cub"])
def test_step1_equals_reference(L, T, W, mode):
    from s2o.kernels import s2o_step1

    gen = torch.Generator().manual_seed(L + T)
    q, k = _exact((2, 4, L, 16), gen), _exact((2, 2, L, 16), gen)
    qp, kvp = s2o_step1(q, k, segment_len=SEG, local_window=W, sort_mode=mode, tail_rank=T,
                        index_dtype=torch.int32)  # fmt: skip
    rqp, rkvp = s2o_permutations(q, k, SEG, W, tail_rank=T)
    assert torch.equal(qp, rqp)
    assert kvp.dtype == torch.int32 and kvp.shape == rkvp.shape, (kvp.shape, rkvp.shape)
    assert torch.equal(kvp.long(), rkvp), f"differs at {(kvp.long() != rkvp).nonzero()[:5]}"


@pytest.mark.interpreter
def test_step1_zero_changes_nothing():
    from s2o.kernels import s2o_step1

    q, k, _ = _qkv(100)
    a = s2o_step1(q, k, segment_len=SEG)
    b = s2o_step1(q, k, segment_len=SEG, tail_rank=0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.interpreter
@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("two_pass", False),
                                            ("fused", False)])  # fmt: skip
@pytest.mark.parametrize("L,T", [(150, 1), (150, 20), (150, 70), (77, 77)])
def test_kernels_match_reference(variant, q_perm, L, T):
    from s2o.kernels import s2o_triton

    q, k, v = _qkv(L, Hq=4, Hkv=2, seed=3, dtype=torch.float16, B=2)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, q_perm=q_perm, tau=0.3,
              tail_rank=T)  # fmt: skip
    perms = s2o_permutations(q, k, SEG, 0, tail_rank=T)
    ref, rst = s2o_reference(q, k, v, perms=perms, **kw)
    out = torch.full_like(q, float("nan"))
    got, st = s2o_triton(q, k, v, variant=variant, out=out, perms=perms, **kw)
    assert not got.isnan().any()
    assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    rel = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert rel < 2e-3, rel
    if T < L % SEG:  # a tail inside the last segment: its own order, not the segment's
        dref, _ = s2o_reference(q, k, v, **{**kw, "tail_rank": 0})
        assert float((ref[..., L - T :, :] - dref[..., L - T :, :]).abs().max()) > 1e-2


@pytest.mark.interpreter
@pytest.mark.parametrize("variant", ["two_pass", "fused"])
def test_kernels_topk_and_budget_match_reference(variant):
    from s2o.kernels import s2o_triton

    q, k, v = _qkv(130, seed=6, dtype=torch.float16)
    perms = s2o_permutations(q, k, SEG, 0, tail_rank=30)
    base = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, q_perm=variant == "two_pass",
                tail_rank=30, perms=perms)  # fmt: skip
    for knobs in (dict(tau=0.0, topk_ratio=0.5), dict(tau=0.3, walk_budget=2)):
        ref, rst = s2o_reference(q, k, v, **base, **knobs)
        got, st = s2o_triton(q, k, v, variant=variant, **base, **knobs)
        assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"]), knobs
        assert float((got.double() - ref.double()).norm() / ref.double().norm()) < 2e-3


@pytest.mark.interpreter
def test_kernels_refuse_perms_without_tail_rows():
    from s2o.kernels import s2o_triton

    q, k, v = _qkv(100)
    perms = s2o_permutations(q, k, SEG)
    with pytest.raises(ValueError, match=r"kv_perm has 4 rows, tail_rank=10 needs 6"):
        s2o_triton(q, k, v, segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.3,
                   perms=perms, tail_rank=10)  # fmt: skip


@pytest.mark.interpreter
def test_method_triton_path_equals_reference_path():
    """End to end through the method (the kernels' own Step 1), GQA 4."""
    q, k, v = _qkv(130, D=32, Hq=4, Hkv=1, seed=5)
    knobs = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.3, tail_rank=40)
    out, st = sparse_attention("s2o", q, k, v, impl="triton", **knobs)
    ref, rst = sparse_attention("s2o", q, k, v, impl="reference", **knobs)
    assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    assert float((out - ref).abs().max()) < 1e-4
