"""eval/significance.py's exact paired tests, multiplicity adjustment and minimum detectable
difference, and analysis/accuracy_tables.py's Spearman with ties, each against scipy or an exact
enumeration on constructed cases."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from analysis import accuracy_tables as at
from eval import significance as sig

# the referee's minimal case: the paired bootstrap gave p = 0.012
A_MIN, B_MIN = [0.2, 0.2, 0.4, 0.4, 0, 0, 0, 0, 0, 0], [0.0] * 10
K = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)  # 2.80


def _scipy_sign_flip(a, b) -> float:
    """scipy's paired permutation test of the mean difference (every sign pattern)."""
    res = stats.permutation_test(
        (np.asarray(a, float), np.asarray(b, float)),
        lambda x, y, axis=-1: np.mean(x - y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=np.inf,
    )
    return float(res.pvalue)


def test_minimal_case_gives_the_exact_0125():
    r = sig.sign_flip_test(A_MIN, B_MIN)
    assert (r["test"], r["nonzero"], r["resolution"]) == ("sign_flip_exact", 4, 0.0)
    assert r["p_value"] == 0.125  # 2 of the 2^4 sign patterns reach |sum| = 1.2
    assert _scipy_sign_flip(A_MIN, B_MIN) == pytest.approx(0.125)
    assert stats.wilcoxon(A_MIN[:4], method="exact").pvalue == pytest.approx(0.125)
    c = sig.compare_paired(A_MIN, B_MIN)
    assert c["test"] == "sign_flip_exact" and c["p_value"] == 0.125
    assert c["lo"] <= c["diff"] <= c["hi"] and c["interval"] == "sign_flip_inverted"


@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_exact_matches_scipy_on_graded_scores(seed):
    """Scores on a 0.2 grid (ties in |sum|, zeros dropped) and on a continuum, up to 12 pairs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 13))
    grid = seed % 2 == 0
    a = rng.integers(0, 6, n) / 5 if grid else rng.random(n)
    b = rng.integers(0, 6, n) / 5 if grid else np.where(rng.random(n) < 0.3, a, rng.random(n))
    ours = sig.sign_flip_test(list(a), list(b))["p_value"]
    assert ours == pytest.approx(_scipy_sign_flip(a, b), abs=1e-12), (list(a), list(b))


def test_sign_flip_enumeration_equals_a_plain_loop():
    d = [0.3, -0.1, 0.7, 0.25, -0.6, 0.05, 0.3]
    obs = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12
               for signs in itertools.product((1, -1), repeat=len(d)))  # fmt: skip
    assert sig.sign_flip_test(d, [0] * len(d))["p_value"] == hits / 2 ** len(d)


def test_sign_flip_at_the_exact_limit_equals_the_binomial():
    """Differences of +-0.5: |sum| is a binomial count, so p is the two-sided sign test's."""
    m = sig.EXACT_MAX
    d = [0.5] * 15 + [-0.5] * (m - 15)
    r = sig.sign_flip_test(d, [0] * m)
    assert r["test"] == "sign_flip_exact"
    assert r["p_value"] == pytest.approx(stats.binomtest(15, m).pvalue, rel=1e-12)


def test_sign_flip_monte_carlo_above_the_limit():
    m = 30
    d = [0.5] * 21 + [-0.5] * 9
    r = sig.sign_flip_test(d, [0] * m, n_resamples=100_000)
    exact = stats.binomtest(21, m).pvalue  # 0.043
    assert r["test"] == "sign_flip_mc" and r["resamples"] == 100_000
    assert r["resolution"] == 1 / 100_001
    se = math.sqrt(exact * (1 - exact) / 100_000)
    assert abs(r["p_value"] - exact) < 5 * se, (r["p_value"], exact)
    # no pattern as extreme as all 30 losses (true p = 2^-29): p is the resolution, not 0
    floor = sig.sign_flip_test([0] * m, [0.5] * m, n_resamples=10_000)
    assert floor["p_value"] == floor["resolution"] == 1 / 10_001
    text = at._p_text(floor["p_value"], floor["resolution"])
    assert text == "<=0.0001 (resolution)" and "1e-4" not in text


def test_sign_flip_without_differences():
    r = sig.sign_flip_test([0.5, 0.25], [0.5, 0.25])
    assert r["p_value"] == 1.0 and r["diff"] == 0.0


@pytest.mark.parametrize("n10,n01", [(0, 7), (1, 6), (3, 3), (2, 9), (0, 0), (12, 4)])
def test_mcnemar_exact_matches_binomtest(n10, n01):
    a = [1] * n10 + [0] * n01 + [1, 0, 1]
    b = [0] * n10 + [1] * n01 + [1, 0, 1]
    r = sig.compare_paired(a, b)
    assert (r["test"], r["n10"], r["n01"]) == ("mcnemar_exact", n10, n01)
    want = 1.0 if n10 + n01 == 0 else stats.binomtest(n10, n10 + n01).pvalue
    assert r["p_value"] == pytest.approx(want, rel=1e-12)
    assert r["resolution"] == 0.0


def test_holm_and_bh_hand_computed():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04; Holm: 4*.005=.02, 3*.01=.03, 2*.03=.06, max(.06, 1*.04)
    assert sig.adjust_p(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: 4/1*.005=.02, 4/2*.01=.02, 4/3*.03=.04, 4/4*.04=.04 (minimum from the top down)
    assert sig.adjust_p(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    # capped at 1; a later smaller ratio pulls BH down: 3*.5/2 = .75 > 3*.6/3 = .6
    assert sig.adjust_p([0.5, 0.6, 0.9], "holm") == pytest.approx([1.0, 1.0, 1.0])
    assert sig.adjust_p([0.5, 0.6, 0.01], "bh") == pytest.approx([0.6, 0.6, 0.03])
    assert sig.adjust_p([], "holm") == []
    with pytest.raises(ValueError, match="'holm' or 'bh'"):
        sig.adjust_p([0.1], "bonferroni")


def test_minimum_detectable_difference_hand_computed():
    # 100 pairs, 30 discordant: above the floor k^2/n = 0.078, MDD = k sqrt(0.3 / 100)
    a, b = [1] * 20 + [0] * 10 + [1] * 70, [0] * 20 + [1] * 10 + [1] * 70
    assert sig.min_detectable_difference(a, b) == pytest.approx(K * math.sqrt(0.3 / 100))
    assert K == pytest.approx(2.8016, abs=1e-4)
    # 20 pairs, 3 discordant: psi = 0.15 < k^2/n = 0.392 -> MDD = k^2 / n
    a, b = [1, 1, 0] + [0] * 17, [0, 0, 1] + [0] * 17
    assert sig.min_detectable_difference(a, b) == pytest.approx(K**2 / 20)
    # graded: psi = mean(d^2) = 50 * 0.25 / 200
    a, b = [0.5] * 50 + [0] * 150, [0.0] * 200
    assert sig.min_detectable_difference(a, b) == pytest.approx(K * math.sqrt(0.0625 / 200))
    assert sig.min_detectable_difference([1] * 4, [0] * 4) == 1.0  # capped


def test_minimum_detectable_difference_has_the_stated_power():
    """At the MDD, the exact McNemar test of 400 pairs with 20% discordant rejects about 80% of
    the time (the normal approximation it is built on)."""
    n, psi = 400, 0.2
    a, b = [1] * 40 + [0] * 360, [0] * 40 + [1] * 40 + [0] * 320  # 80 discordant
    mdd = sig.min_detectable_difference(a, b)
    assert mdd == pytest.approx(K * math.sqrt(psi / n))
    m = round(n * psi)
    q = 0.5 + mdd / (2 * psi)  # P(a discordant pair favours a) under the true difference mdd
    power = sum(stats.binom.pmf(j, m, q) for j in range(m + 1)
                if stats.binomtest(j, m).pvalue < 0.05)  # fmt: skip
    assert 0.7 < power < 0.9, power


def test_spearman_ties_float_noise():
    noisy = [8.999999999999998, 9.000000000000002, 10.0]
    assert stats.spearmanr([1, 2, 3], noisy).statistic == pytest.approx(1.0)  # noise ranked
    r = at.spearman([1, 2, 3], noisy)
    assert r["rho"] == pytest.approx(stats.spearmanr([1, 2, 3], [9, 9, 10]).statistic)
    assert r["rho"] == pytest.approx(math.sqrt(3) / 2)


def test_spearman_permutation_p_against_enumeration_and_scipy():
    x = [1e-4, 3e-4, 2e-4, 8e-4, 5e-4, 1e-3]
    y = [40.0, 35.0, 8.999999999999998, 20.0, 9.000000000000002, 5.0]
    r = at.spearman(x, y)
    yr = [round(v, 6) for v in y]
    rho = stats.spearmanr(x, yr).statistic
    perms = [stats.spearmanr(x, p).statistic for p in itertools.permutations(yr)]
    le = np.mean([s <= rho + 1e-12 for s in perms])
    ge = np.mean([s >= rho - 1e-12 for s in perms])
    assert r["rho"] == pytest.approx(rho) and r["resolution"] == 0.0
    assert r["p_value"] == pytest.approx(min(1.0, 2 * min(le, ge)))
    doc = stats.permutation_test((yr,), lambda v: stats.spearmanr(x, v).statistic,
                                 permutation_type="pairings")  # fmt: skip
    assert r["p_value"] == pytest.approx(doc.pvalue)
    big = at.spearman(list(range(12)), list(range(12)))  # Monte Carlo, no pairing as extreme
    assert big["resolution"] == 2 / 100_000 and big["p_value"] == pytest.approx(big["resolution"])
    assert at._p_text(big["p_value"], big["resolution"], short=True) == "p<=2e-05"
