"""FlexPrefill, XAttention and PBS on the CPU.

* Every estimation step against a plain per-head re-implementation of the official algorithm
  (loops, float64) on tiny inputs: equal block sets on inputs whose scores are well separated.
* Keep-everything settings give dense causal attention; the main knob moves sparsity the right
  way (and the sparser mask is a subset of the denser one); knob validation.
"""

import math
from pathlib import Path

import pytest
import torch

import s2o
from s2o.methods import flexprefill as fp
from s2o.methods import pbs, xattn
from s2o.methods.blocksparse import block_causal
from s2o.methods.full import full_attention


def _structured(B, Hq, Hkv, L, D, seed, n_heavy=6, sink=5.0):
    """Random q/k/v plus an attention sink at token 0 and a few heavy-hitter keys."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g) * 0.6
    k = torch.randn(B, Hkv, L, D, generator=g) * 0.6
    v = torch.randn(B, Hkv, L, D, generator=g)
    u = torch.randn(D, generator=g)
    u = u / u.norm()
    q += 1.5 * u
    k[:, :, 0] += sink * u
    heavy = torch.randperm(L - 1, generator=g)[:n_heavy] + 1
    k[:, :, heavy] += 2.5 * u
    return q, k, v


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


# ---------------------------------------------------------------- plain references (per head)


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _flex_plain(q, k, *, gamma, tau, min_budget, max_budget, bs):
    """Literal per-(b, h) FlexPrefill get_active_blocks in float64 -> (sets, details)."""
    B, Hq, L, D = q.shape
    G = Hq // k.shape[1]
    nb = math.ceil(L / bs)
    scale = D**-0.5
    min_b = math.ceil((min_budget or 1) / bs)
    max_b = min(math.ceil((max_budget or 2**31 - 1) / bs), nb)
    sets, det = {}, {}
    for b in range(B):
        for h in range(Hq):
            ql, kk = q[b, h, -bs:].double(), k[b, h // G].double()
            s = ql @ kk.T * scale
            for i in range(bs):
                for j in range(i + 1, bs):
                    s[i, L - bs + j] = -math.inf
            a = _softmax(s)
            vertical = a.mean(0)
            slash = torch.zeros(L, dtype=torch.float64)
            for i in range(bs):
                for c in range(L - bs + i + 1):
                    slash[L - 1 - (L - bs + i - c)] += a[i, c]
            slash /= bs
            ns = []
            for x in (vertical, slash):
                cum = torch.cumsum(x.sort(descending=True).values, 0)
                n = int((cum <= gamma).sum()) + 1
                ns.append(min(max(n // 128 + 1, min_b), max_b))
            vb = torch.stack([vertical[j * bs : (j + 1) * bs].sum() for j in range(nb)])
            sb = torch.stack([slash[j * bs : (j + 1) * bs].sum() for j in range(nb)])
            avg_k = torch.stack([kk[j * bs : (j + 1) * bs].mean(0) for j in range(nb)])
            est = _softmax(ql.mean(0) @ avg_k.T * scale)
            m = (est + vb) / 2
            js = math.sqrt(0.5 * float((est * (est / m).log()).sum() + (vb * (vb / m).log()).sum()))
            aware = js < tau
            n_v, n_s = (min_b, min_b) if aware else ns
            vb[0], sb[-1] = math.inf, math.inf
            cols = torch.argsort(vb, descending=True)[:n_v].tolist()
            offs = [nb - 1 - j for j in torch.argsort(sb, descending=True)[:n_s].tolist()]
            blocks = {(r, c) for c in cols for r in range(c, nb)}
            blocks |= {(r + o, r) for o in offs for r in range(nb) if r + o < nb}
            if aware:
                qq = q[b, h].double()
                avg_q = torch.stack([qq[j * bs : (j + 1) * bs].mean(0) for j in range(nb)])
                att = avg_q @ avg_k.T * scale
                att = att.masked_fill(~block_causal(nb, att.device), -math.inf)
                flat = _softmax(att).flatten()
                vals, order = flat.sort(descending=True)
                cum = torch.cumsum(vals, 0)
                blocks |= {divmod(int(o), nb) for o, c in zip(order, cum) if c <= gamma * nb}
            sets[b, h] = blocks
            det[b, h] = dict(vertical=vertical, slash=slash, n=(n_v, n_s), js=js, aware=aware)
    return sets, det


def _xattn_plain(q, k, *, bs, stride, threshold):
    """Per-head antidiagonal scores (explicit sums over t) and the official row selection."""
    B, Hq, L, D = q.shape
    G = Hq // k.shape[1]
    nb = math.ceil(L / bs)
    R = nb * bs // stride
    scale = D**-0.5 / stride
    sets, scores = {}, torch.zeros(B, Hq, nb, nb, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            qq = torch.zeros(nb * bs, D, dtype=torch.float64)
            kk = torch.zeros(nb * bs, D, dtype=torch.float64)
            qq[:L], kk[:L] = q[b, h].double(), k[b, h // G].double()
            r_mat = torch.zeros(R, R, dtype=torch.float64)
            for t in range(stride):
                r_mat += qq[stride - 1 - t :: stride] @ kk[t::stride].T
            r_mat = r_mat * scale
            for i in range(R):
                r_mat[i, i + 1 :] = -math.inf
            p = _softmax(r_mat)
            p[math.ceil(L / stride) :] = 0
            rb = bs // stride
            sc = p.view(nb, rb, nb, rb).sum((1, 3))
            scores[b, h] = sc
            blocks = set()
            for r in range(nb):
                forced = {0, r}
                mass = sum(float(sc[r, c]) for c in forced)
                need = float(sc[r].sum()) * threshold
                blocks |= {(r, c) for c in forced}
                others = sorted((c for c in range(nb) if c not in forced), key=lambda c: -sc[r, c])
                for c in others:
                    if mass >= need:
                        break
                    if c <= r:
                        blocks.add((r, c))
                    mass += float(sc[r, c])
            sets[b, h] = blocks
    return sets, scores


def _pbs_plain(q, k, *, bs, seg, threshold):
    """Per-head PBS: importance, in-segment sort, pooled scores, cumulative cut, forced block."""
    B, Hq, L, D = q.shape
    G = Hq // k.shape[1]
    nb, nseg = math.ceil(L / bs), L // seg
    scale = D**-0.5
    sets, perms = {}, {}
    for b in range(B):
        for h in range(Hq):
            kk = k[b, h // G].double()
            perm = list(range(L))
            if not (nseg == 0 or (nseg == 1 and L == seg)):
                lc = nseg * seg
                imp = _softmax(q[b, h, -bs:].double() @ kk[:lc].T * scale).mean(0)
                for n in range(nseg):
                    order = sorted(range(seg), key=lambda j: -float(imp[n * seg + j]))
                    perm[n * seg : (n + 1) * seg] = [n * seg + j for j in order]
            perms[b, h] = perm
            kp = torch.zeros(nb * bs, D, dtype=torch.float64)
            qp = torch.zeros(nb * bs, D, dtype=torch.float64)
            kp[:L], qp[:L] = kk[perm], q[b, h].double()
            kbar, qbar = kp.view(nb, bs, D).mean(1), qp.view(nb, bs, D).mean(1)
            s = qbar @ kbar.T * scale
            blocks = set()
            first = perm.index(0) // bs
            for r in range(nb):
                ok = [c for c in range(nb) if c <= r and c // (seg // bs) != r // (seg // bs)]
                if not ok:
                    continue
                pr = _softmax(torch.tensor([float(s[r, c]) for c in ok], dtype=torch.float64))
                acc = 0.0
                for i in torch.argsort(pr, descending=True).tolist():
                    blocks.add((r, ok[i]))
                    acc += float(pr[i])
                    if acc >= threshold:
                        break
                else:
                    blocks -= {(r, c) for c in ok}
                if first in ok:
                    blocks.add((r, first))
            sets[b, h] = blocks
    return sets, perms


def _mask_sets(mask):
    B, H = mask.shape[:2]
    return {
        (b, h): {tuple(x) for x in mask[b, h].nonzero().tolist()}
        for b in range(B)
        for h in range(H)
    }


# ---------------------------------------------------------------- estimation steps vs plain


def test_flexprefill_steps_equal_plain_reference():
    q, k, _ = _structured(2, 4, 2, 600, 32, seed=1)
    bs, gamma = 128, 0.9
    scale = 32**-0.5
    probs = fp.last_block_probs(q, k, bs, scale)
    vertical, slash = fp.vertical_slash_scores(probs)
    # tau between two JS values of the plain reference: both head kinds occur
    _, det = _flex_plain(q, k, gamma=gamma, tau=0.0, min_budget=None, max_budget=None, bs=bs)
    js = sorted(d["js"] for d in det.values())
    gaps = [(js[i + 1] - js[i], i) for i in range(len(js) - 1)]
    _, i = max(gaps)
    tau = (js[i] + js[i + 1]) / 2
    sets, det = _flex_plain(q, k, gamma=gamma, tau=tau, min_budget=None, max_budget=None, bs=bs)
    plan = fp.flexprefill_plan(
        q, k, gamma=gamma, tau=tau, min_budget=None, max_budget=None, block_size=bs, scale=None
    )
    for (b, h), d in det.items():
        assert torch.allclose(vertical[b, h].double(), d["vertical"], atol=1e-6), (b, h)
        assert torch.allclose(slash[b, h].double(), d["slash"], atol=1e-6), (b, h)
        assert (int(plan.extra["n_vertical"][b, h]), int(plan.extra["n_slash"][b, h])) == d["n"]
        assert abs(float(plan.extra["js"][b, h]) - d["js"]) < 1e-5, (b, h)
        assert bool(plan.extra["query_aware"][b, h]) == d["aware"], (b, h)
    kinds = {d["aware"] for d in det.values()}
    assert kinds == {True, False}, f"test needs both head kinds, got {kinds}"
    assert _mask_sets(plan.mask) == sets


def test_flexprefill_budget_clamps_and_dense_fallback():
    q, k, _ = _structured(1, 2, 1, 700, 32, seed=2)
    for mn, mx in ((300, None), (None, 200), (600, 200)):
        sets, _ = _flex_plain(q, k, gamma=0.95, tau=0.0, min_budget=mn, max_budget=mx, bs=64)
        plan = fp.flexprefill_plan(
            q, k, gamma=0.95, tau=0.0, min_budget=mn, max_budget=mx, block_size=64, scale=None
        )
        assert _mask_sets(plan.mask) == sets, (mn, mx)
    plan = fp.flexprefill_plan(
        q, k, gamma=0.9, tau=0.1, min_budget=1024, max_budget=None, block_size=128, scale=None
    )
    nb = plan.mask.shape[-1]
    assert plan.extra["dense_fallback"] and int(plan.mask.sum()) == 2 * nb * (nb + 1) // 2


def test_xattn_scores_and_selection_equal_plain_reference():
    q, k, _ = _structured(2, 4, 2, 500, 32, seed=3)
    for bs, stride in ((64, 8), (32, 4)):
        sets, scores = _xattn_plain(q, k, bs=bs, stride=stride, threshold=0.9)
        ours = xattn.antidiagonal_block_scores(
            q, k, block_size=bs, stride=stride, scale=32**-0.5, norm=1.0
        )
        err = float((ours.double() - scores).abs().max())
        assert err < 1e-5, f"block scores differ by {err}"
        assert _mask_sets(xattn.select_blocks(ours, 0.9)) == sets


@pytest.mark.parametrize("sink", [5.0, 0.0])  # without a sink token 0 is rarely permuted first
def test_pbs_permutation_and_selection_equal_plain_reference(sink):
    q, k, _ = _structured(2, 4, 2, 1000, 32, seed=4, sink=sink)
    cases = [(1000, 0.9), (1000, 0.3), (512, 0.5), (200, 0.9)]  # remainder, exact, no segment
    for L, thr in cases:
        sets, perms = _pbs_plain(q[:, :, :L], k[:, :, :L], bs=64, seg=128, threshold=thr)
        plan = pbs.pbs_plan(
            q[:, :, :L], k[:, :, :L], threshold=thr, block_size=64, segment_size=128,
            force_first_block=True, query_pool="mean", key_pool="mean", scale=None,
        )  # fmt: skip
        for (b, h), perm in perms.items():
            assert plan.key_perm[b, h].tolist() == perm, (L, b, h)
        assert _mask_sets(plan.mask) == sets, (L, thr)


# ---------------------------------------------------------------- method-level behaviour

KEEP_ALL = {
    "flexprefill": dict(gamma=2.0, min_budget=None, block_size=128),
    "xattn": dict(threshold=2.0, block_size=32, stride=4),
    "pbs": dict(threshold=1.0, block_size=32, segment_size=64),
}


@pytest.mark.parametrize("method", sorted(KEEP_ALL))
def test_keep_everything_equals_dense(method):
    q, k, v = _structured(2, 4, 2, 301, 32, seed=5)
    out, stats = s2o.sparse_attention(method, q, k, v, impl="reference", **KEEP_ALL[method])
    ref = full_attention(q, k, v, backend="math")
    err = _rel(out, ref)
    assert err < 1e-5, f"{method}: rel err vs dense {err}"
    assert stats.sparsity == 0.0, f"{method}: sparsity {stats.sparsity}"


SWEEPS = {
    "flexprefill": (dict(min_budget=None, block_size=64, tau=0.0), [0.5, 0.99]),
    "xattn": (dict(block_size=64, stride=8), [0.5, 0.95]),
    "pbs": (dict(block_size=64, segment_size=128), [0.5, 0.95]),
}


@pytest.mark.parametrize("method", sorted(SWEEPS))
def test_main_knob_moves_sparsity(method):
    q, k, v = _structured(1, 4, 2, 2048, 32, seed=6)
    m = s2o.METHODS[method]
    fixed, values = SWEEPS[method]
    plans = [m.estimate(q, k, v, **{**m.defaults, **fixed, m.main_knob: x}) for x in values]
    d = [float(p.mask.double().mean()) for p in plans]
    assert d[0] < d[1], f"{method}: density {d} for {m.main_knob}={values}"
    assert not m.sparsity_increases_with_knob
    assert bool((plans[0].mask <= plans[1].mask).all()), f"{method}: sparser mask not a subset"


@pytest.mark.parametrize("method", sorted(KEEP_ALL))
def test_knob_validation(method):
    q, k, v = _structured(1, 2, 1, 64, 16, seed=7)
    with pytest.raises(ValueError, match="valid knobs"):
        s2o.sparse_attention(method, q, k, v, not_a_knob=1)
    main = s2o.METHODS[method].main_knob
    with pytest.raises(ValueError, match=main):
        s2o.sparse_attention(method, q, k, v, **{main: -1.0})
    with pytest.raises(ValueError, match="impl"):
        s2o.sparse_attention(method, q, k, v, impl="cuda")


def test_sparsity_counts_tiles():
    """Stats equal the tile count of the plan (PBS: selected blocks + causal own-segment tiles)."""
    q, k, v = _structured(1, 2, 1, 700, 32, seed=8)
    out, stats = s2o.sparse_attention("pbs", q, k, v, block_size=64, segment_size=128)
    plan = s2o.METHODS["pbs"].estimate(
        q, k, v, **{**s2o.METHODS["pbs"].defaults, "block_size": 64, "segment_size": 128}
    )
    nb = 11
    own = sum(r % 2 + 1 for r in range(nb))
    expect = plan.mask.sum((-1, -2)).double() + own
    assert torch.equal(stats.tiles_processed, expect)
    assert stats.tiles_dense == nb * (nb + 1) // 2


@pytest.mark.parametrize("method", ["flexprefill", "flashprefill", "xattn", "pbs"])
def test_conf_keys_equal_defaults(method):
    import yaml

    from s2o.methods.flashprefill import V2_KNOBS

    path = Path(__file__).resolve().parents[1] / "conf" / "method" / f"{method}.yaml"
    keys = set(yaml.safe_load(path.read_text()))
    # FlashPrefill v2's knobs are off by default and left out of the file (the identity of a
    # default run stays v1's); +method.<knob>=... adds them
    optional = set(V2_KNOBS) if method == "flashprefill" else set()
    want = set(s2o.METHODS[method].defaults) - optional
    assert keys == want, keys ^ want
