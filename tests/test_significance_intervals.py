"""eval/significance.py's intervals without resampling and its unpaired comparison, each against
scipy / statsmodels or an exact enumeration on constructed cases: Tango's paired score interval
(its constrained MLE against a numeric optimum, its ends against the score test, its coverage
enumerated over the multinomial), the inverted sign-flip test (its ends against scipy's
permutation test), Newcombe's interval, Fisher's and the two-sample permutation test; Holm, BH
and Wilson against statsmodels where it is installed."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import optimize, stats

from eval import significance as sig

Z = NormalDist().inv_cdf(0.975)
A_MIN, B_MIN = [0.2, 0.2, 0.4, 0.4, 0, 0, 0, 0, 0, 0], [0.0] * 10


def _numeric_p01(n10, n01, n, delta):
    """argmax over p01 of the multinomial log-likelihood with p10 = p01 + delta."""
    nc = n - n10 - n01

    def nll(x):
        p10, p01, pc = x + delta, x, 1 - 2 * x - delta
        if min(p10, p01, pc) < 0:
            return math.inf
        return -sum(k * math.log(max(p, 1e-300)) for k, p in ((n10, p10), (n01, p01), (nc, pc)))

    lo, hi = max(0.0, -delta), (1 - delta) / 2
    return optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded",
                                    options={"xatol": 1e-12}).x  # fmt: skip


@pytest.mark.parametrize(("n10", "n01", "n"), [(3, 1, 20), (0, 9, 25), (5, 5, 40), (7, 0, 10)])
@pytest.mark.parametrize("delta", [-0.4, -0.1, 0.05, 0.3])
def test_tango_constrained_mle_is_the_numeric_optimum(n10, n01, n, delta):
    if not -1 < delta < 1:
        return
    ours = sig._tango_p01(n10, n01, n, delta)
    assert ours == pytest.approx(_numeric_p01(n10, n01, n, delta), abs=1e-6), (n10, n01, delta)


@pytest.mark.parametrize(("n10", "n01", "n"), [(3, 1, 20), (0, 9, 25), (5, 5, 40), (0, 0, 10)])
def test_tango_ends_are_where_the_score_test_reaches_z(n10, n01, n):
    lo, hi = sig.tango_interval(n10, n01, n)
    assert lo < (n10 - n01) / n < hi
    for end in (lo, hi):  # Z recomputed with the numerically optimized nuisance parameter
        p01 = _numeric_p01(n10, n01, n, end)
        zs = (n10 - n01 - n * end) / math.sqrt(n * (2 * p01 + end * (1 - end)))
        assert abs(zs) == pytest.approx(Z, abs=1e-4), (end, zs)


def test_tango_at_the_edges():
    assert sig.tango_interval(10, 0, 10)[1] == 1.0
    assert sig.tango_interval(0, 10, 10)[0] == -1.0
    lo, hi = sig.tango_interval(0, 0, 10)
    assert lo == pytest.approx(-hi) and 0 < hi < 1
    with pytest.raises(ValueError):
        sig.tango_interval(6, 5, 10)


@pytest.mark.parametrize(("n", "p10", "p01"), [(20, 0.05, 0.3), (30, 0.1, 0.05), (30, 0.2, 0.2),
                                               (50, 0.15, 0.05)])  # fmt: skip
def test_tango_coverage_enumerated(n, p10, p01):
    """Exact coverage: every (n10, n01, concordant) outcome weighted by its multinomial
    probability; Tango's interval holds close to its nominal 95% (Fagerland et al. 2014)."""
    cover = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            lo, hi = sig.tango_interval(a, b, n)
            if lo <= p10 - p01 <= hi:
                cover += stats.multinomial.pmf([a, b, n - a - b], n, [p10, p01, 1 - p10 - p01])
    assert 0.94 <= cover <= 0.975, cover


def _scipy_p(d, delta):
    """scipy's exact paired permutation test of mean(d - delta) against 0."""
    x = np.asarray(d, float) - delta
    return stats.permutation_test((x, np.zeros_like(x)), lambda u, v, axis=-1: np.mean(u - v, axis),
                                  permutation_type="samples", vectorized=True,
                                  n_resamples=np.inf).pvalue  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_sign_flip_interval_ends_against_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(7, 12))
    a, b = rng.integers(0, 6, n) / 5, rng.integers(0, 6, n) / 5
    d = a - b
    lo, hi = sig.sign_flip_interval(list(a), list(b))
    assert lo <= d.mean() <= hi
    for end, out in ((lo, -1), (hi, 1)):  # inside: p >= 0.05; a step outside: p < 0.05
        assert _scipy_p(d, end - out * 1e-5) >= 0.05 - 1e-9, (end, list(a), list(b))
        assert _scipy_p(d, end + out * 1e-5) < 0.05, (end, list(a), list(b))


def test_minimal_case_interval_holds_zero():
    lo, hi = sig.sign_flip_interval(A_MIN, B_MIN)
    assert lo == pytest.approx(0.0, abs=1e-5) and hi == pytest.approx(0.25, abs=1e-5)
    assert _scipy_p(np.array(A_MIN), 0.0) == pytest.approx(0.125)  # 0 inside: p = 0.125
    c = sig.compare_paired(A_MIN, B_MIN)
    assert (c["p_value"], c["interval"]) == (0.125, "sign_flip_inverted")


def test_sign_flip_interval_monte_carlo_above_the_limit():
    rng = np.random.default_rng(3)
    a, b = list(rng.random(40)), list(rng.random(40))
    lo, hi = sig.sign_flip_interval(a, b)
    d = np.asarray(a) - np.asarray(b)
    t = stats.ttest_1samp(d, 0).confidence_interval()  # near the t interval at n = 40
    assert abs(lo - t.low) < 0.03 and abs(hi - t.high) < 0.03, (lo, hi, t)


def test_paired_interval_dispatch():
    assert sig.paired_interval([1, 0, 1], [0, 0, 1])["interval"] == "tango_score"
    assert sig.paired_interval([0.5, 0, 1], [0, 0, 1])["interval"] == "sign_flip_inverted"


def test_newcombe_against_statsmodels():
    sp = pytest.importorskip("statsmodels.stats.proportion")
    for x1, n1, x2, n2 in [(20, 25, 10, 25), (0, 10, 3, 16), (16, 16, 5, 16), (7, 50, 9, 40)]:
        ref = sp.confint_proportions_2indep(x1, n1, x2, n2, method="newcomb", compare="diff")
        assert sig.newcombe_interval(x1, n1, x2, n2) == pytest.approx(ref, abs=1e-12)


def test_compare_independent_binary_is_fisher():
    a, b = [1] * 20 + [0] * 5, [1] * 10 + [0] * 15
    c = sig.compare_independent(a, b)
    assert c["test"] == "fisher_exact" and c["interval"] == "newcombe"
    # Fisher's two-sided p by hand: every table with these margins at most as likely as the seen
    hyper = stats.hypergeom(50, 30, 25)
    seen = hyper.pmf(20)
    p = sum(hyper.pmf(k) for k in range(31) if hyper.pmf(k) <= seen * (1 + 1e-7))
    assert c["p_value"] == pytest.approx(p, rel=1e-9)
    assert c["lo"] < 0.4 < c["hi"]


def test_compare_independent_graded_enumerated():
    a, b = [0.2, 0.6, 1.0, 0.4, 0.8], [0.0, 0.2, 0.4, 0.2]
    c = sig.compare_independent(a, b)
    pooled, obs = a + b, np.mean(a) - np.mean(b)
    diffs = []
    for idx in itertools.combinations(range(9), 5):  # every split of the 9 scores into 5 and 4
        x = [pooled[i] for i in idx]
        diffs.append(np.mean(x) - np.mean([pooled[i] for i in range(9) if i not in idx]))
    diffs = np.array(diffs)
    tail = min(np.mean(diffs >= obs - 1e-12), np.mean(diffs <= obs + 1e-12))
    assert c["test"] == "permutation" and c["resolution"] == 0.0
    assert c["p_value"] == pytest.approx(min(1.0, 2 * tail))  # the doubled smaller tail
    t = stats.ttest_ind(a, b, equal_var=False).confidence_interval()
    assert (c["lo"], c["hi"]) == pytest.approx((t.low, t.high))


def test_holm_bh_against_statsmodels():
    mt = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    for p in (rng.random(12), rng.random(12) ** 4, np.array([0.01, 0.04, 0.03, 0.2, 0.01])):
        for ours, theirs in (("holm", "holm"), ("bh", "fdr_bh")):
            ref = mt.multipletests(p, method=theirs)[1]
            assert sig.adjust_p(list(p), ours) == pytest.approx(list(ref), abs=1e-12)


def test_wilson_against_statsmodels():
    sp = pytest.importorskip("statsmodels.stats.proportion")
    for x, n in [(0, 10), (3, 10), (25, 25), (46, 120)]:
        ref = sp.proportion_confint(x, n, method="wilson")
        assert sig.wilson_interval(x, n) == pytest.approx(ref, abs=1e-12)
