"""Uncertainty of benchmark scores: a 95% interval on one method's accuracy (Wilson for 0/1
scores, bootstrap for continuous ones) and a paired comparison of two methods scored on the same
samples: an exact test (McNemar's for 0/1 scores, a sign-flip permutation test of the mean
difference for graded ones), a paired interval of the difference without resampling (Tango's score
interval for 0/1 scores, the sign-flip test inverted for graded ones), the minimum difference the
cell's n could detect, and Holm / Benjamini-Hochberg adjustment of a family of p-values. Two
methods or recipes scored on different samples: ``compare_independent`` (Fisher's exact test and
Newcombe's hybrid score interval for 0/1 scores, a two-sample permutation test and Welch's
interval otherwise).

With n = 16 to 50 samples per cell, a few points of accuracy are within noise: report these next
to every accuracy and every difference. A paired bootstrap p-value is too small at these n (scores
[.2, .2, .4, .4, 0 x 6] against ten zeros: bootstrap 0.012, exact sign-flip 0.125), so p-values
come from the exact tests only.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

EXACT_MAX = 20  # sign-flip test: enumerate all 2^m sign patterns up to m nonzero differences
N_RESAMPLES = 100_000  # above: Monte Carlo sign patterns, p resolution 1 / (N_RESAMPLES + 1)
ALPHA, POWER = 0.05, 0.8  # the minimum detectable difference: two-sided 0.05, 80% power


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion ``successes / n`` (in [0, 1])."""
    if n <= 0:
        return (0.0, 1.0)
    z, p = _z(confidence), successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at p = 0 (p = 1) the bound is exactly 0 (1); center - half rounds to about 1e-17 there
    lo = 0.0 if successes <= 0 else max(0.0, center - half)
    hi = 1.0 if successes >= n else min(1.0, center + half)
    return (lo, hi)


def bootstrap_interval(
    scores: Sequence[float], confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean score (resampling samples with replacement)."""
    x = np.asarray(scores, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    a = (1 - confidence) / 2
    return (float(np.quantile(means, a)), float(np.quantile(means, 1 - a)))


def is_binary(scores: Sequence[float]) -> bool:
    return all(s in (0, 1) for s in scores)


def score_interval(scores: Sequence[float], confidence: float = 0.95, seed: int = 0) -> dict:
    """Mean, n and a ``confidence`` interval: Wilson for 0/1 scores, bootstrap otherwise."""
    n = len(scores)
    mean = float(np.mean(scores)) if n else math.nan
    if is_binary(scores):
        lo, hi = wilson_interval(sum(scores), n, confidence)
        method = "wilson"
    else:
        lo, hi = bootstrap_interval(scores, confidence, seed=seed)
        method = "bootstrap"
    return {"mean": mean, "n": n, "lo": lo, "hi": hi, "interval": method, "confidence": confidence}


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> dict:
    """McNemar's exact test on paired 0/1 scores: ``n10`` samples only ``a`` got right, ``n01``
    only ``b``; two-sided p = P(Binomial(n10 + n01, 1/2) as or more extreme)."""
    _check_paired(a, b)
    if not (is_binary(a) and is_binary(b)):
        raise ValueError("McNemar's test needs 0/1 scores; use paired_bootstrap")
    n10 = sum(1 for x, y in zip(a, b) if x == 1 and y == 0)
    n01 = sum(1 for x, y in zip(a, b) if x == 0 and y == 1)
    m, k = n10 + n01, min(n10, n01)
    p = 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2**m)
    return {
        "test": "mcnemar_exact",
        "n": len(a),
        "n10": n10,
        "n01": n01,
        "diff": (n10 - n01) / len(a),
        "p_value": p,
    }


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> dict:
    """Percentile interval of ``mean(a) - mean(b)`` from a paired bootstrap (the same resampled
    samples for both). No p-value: at n = 10 to 50 the bootstrap's is too small (module
    docstring); use ``mcnemar_exact`` or ``sign_flip_test``."""
    _check_paired(a, b)
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return {
        "interval": "paired_bootstrap",
        "n": int(d.size),
        "diff": float(d.mean()),
        "lo": float(np.quantile(boots, alpha)),
        "hi": float(np.quantile(boots, 1 - alpha)),
        "confidence": confidence,
    }


def sign_flip_test(
    a: Sequence[float],
    b: Sequence[float],
    exact_max: int = EXACT_MAX,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> dict:
    """Two-sided sign-flip (paired permutation) test of ``mean(a) - mean(b)``.

    Under H0 (the two methods' scores are exchangeable within a sample) each paired difference
    ``d_i = a_i - b_i`` is as likely as ``-d_i``; p is the share of the ``2^m`` sign patterns of
    the ``m`` nonzero differences whose ``|sum|`` is at least the observed one (zeros flip to
    themselves and drop out). Up to ``exact_max`` nonzero differences every pattern is
    enumerated (``p`` exact, ``resolution`` 0); above, ``n_resamples`` random patterns give
    ``p = (1 + hits) / (n_resamples + 1)``, never below ``resolution = 1 / (n_resamples + 1)``.
    Sums within a relative 1e-9 of the observed one count as ties (float noise).
    """
    _check_paired(a, b)
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    nz = d[d != 0]
    m, obs = int(nz.size), abs(float(nz.sum()))
    tol = 1e-9 * float(np.abs(nz).sum())
    out = {"test": "sign_flip_exact", "n": int(d.size), "nonzero": m, "diff": float(d.mean()),
           "resolution": 0.0}  # fmt: skip
    if m == 0:
        return {**out, "p_value": 1.0}
    if m <= exact_max:
        sums = np.zeros(1)
        for x in nz:  # every sign pattern's sum, doubling: 2^m values
            sums = np.concatenate([sums + x, sums - x])
        return {**out, "p_value": float(np.mean(np.abs(sums) >= obs - tol))}
    rng = np.random.default_rng(seed)
    hits, chunk = 0, max(1, 2_000_000 // m)
    for start in range(0, n_resamples, chunk):
        k = min(chunk, n_resamples - start)
        signs = rng.integers(0, 2, size=(k, m)) * 2 - 1
        hits += int(np.sum(np.abs(signs @ nz) >= obs - tol))
    res = 1 / (n_resamples + 1)
    return {**out, "test": "sign_flip_mc", "p_value": (1 + hits) * res, "resolution": res,
            "resamples": n_resamples}  # fmt: skip


def min_detectable_difference(
    a: Sequence[float], b: Sequence[float], alpha: float = ALPHA, power: float = POWER
) -> float:
    """The smallest true difference of mean scores (either sign) that a two-sided ``alpha``
    test of these n pairs detects with probability ``power``, by the normal approximation of
    McNemar's / the sign-flip test (whose null variance of ``sum(d)`` is ``sum(d_i^2)``):

        MDD = k * sqrt(max(psi, k^2 / n) / n),  k = z(1 - alpha / 2) + z(power),
        psi = mean(d_i^2)  (for 0/1 scores: the share of discordant pairs, (n10 + n01) / n)

    (k = 2.80 at 0.05 and 80%). The floor ``k^2 / n`` on psi: a true difference delta of 0/1
    scores needs at least delta discordant pairs, so psi >= MDD (exact for 0/1 scores; for
    graded ones it treats each differing sample as a whole point apart, which can only widen the
    MDD). Capped at 1. Per comparison, before any multiplicity adjustment."""
    _check_paired(a, b)
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = d.size
    k = _z(1 - alpha) + NormalDist().inv_cdf(power)
    psi = float(np.mean(d * d))
    return min(1.0, k * math.sqrt(max(psi, k * k / n) / n))


def adjust_p(p_values: Sequence[float], method: str = "holm") -> list[float]:
    """Multiplicity-adjusted p-values of one family, in the given order. ``holm``: Holm's
    step-down (family-wise error; any dependence), adjusted p_(i) = max over j <= i of
    (m - j + 1) p_(j) with p_(1) <= ... <= p_(m); ``bh``: Benjamini-Hochberg (false discovery
    rate; independent or positively dependent tests), adjusted p_(i) = min over j >= i of
    m p_(j) / j. Both capped at 1."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    ranked = p[order]
    if method == "holm":
        adj = np.maximum.accumulate((m - np.arange(m)) * ranked)
    elif method == "bh":
        adj = np.minimum.accumulate((m * ranked / np.arange(1, m + 1))[::-1])[::-1]
    else:
        raise ValueError(f"unknown adjustment {method!r}: 'holm' or 'bh'")
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return [float(x) for x in out]


def tango_interval(n10: int, n01: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Tango's (1998) score interval for a paired difference of proportions ``(n10 - n01) / n``
    (``n10`` pairs with only the first right, ``n01`` only the second, ``n`` pairs): every delta
    whose score statistic

        Z(delta) = (n10 - n01 - n delta) / sqrt(n (2 p01~ + delta (1 - delta)))

    lies within +-z, ``p01~`` the maximum-likelihood P(only the second right) under the
    constraint P(only the first) - P(only the second) = delta (a quadratic's root, ``_tango_p01``).
    No resampling; recommended for paired proportions at small n (Fagerland, Lydersen and
    Laake 2014). ``Z`` decreases in delta, so each end is one root (``scipy.optimize.brentq``)."""
    from scipy.optimize import brentq

    if n <= 0 or n10 < 0 or n01 < 0 or n10 + n01 > n:
        raise ValueError(f"tango_interval: need 0 <= n10 + n01 <= n, got {n10}, {n01}, {n}")
    z, est = _z(confidence), (n10 - n01) / n

    def excess(delta: float, sign: float) -> float:  # Z(delta) -+ z: zero at an end
        var = n * (2 * _tango_p01(n10, n01, n, delta) + delta * (1 - delta))
        return (n10 - n01 - n * delta) / math.sqrt(max(var, 1e-300)) + sign * z

    edge = 1 - 1e-12
    hi = edge if excess(edge, 1) >= 0 else brentq(excess, est, edge, args=(1,), xtol=1e-12)
    lo = -edge if excess(-edge, -1) <= 0 else brentq(excess, -edge, est, args=(-1,), xtol=1e-12)
    return (-1.0 if lo <= -edge else lo, 1.0 if hi >= edge else hi)


def _tango_p01(n10: int, n01: int, n: int, delta: float) -> float:
    """The constrained MLE of P(only the second right) given p10 - p01 = delta: the root of
    ``2n x^2 - B x - n01 delta (1 - delta) = 0``, ``B = n10 + n01 + (n10 - n01 - 2n) delta``,
    that maximizes the multinomial likelihood (Tango 1998, eq. 4)."""
    b = n10 + n01 + (n10 - n01 - 2 * n) * delta
    disc = b * b + 8 * n * n01 * delta * (1 - delta)
    return max(0.0, (b + math.sqrt(max(disc, 0.0))) / (4 * n))


@functools.lru_cache(maxsize=2)
def _sign_patterns(n: int, exact: bool, n_resamples: int, seed: int) -> tuple:
    """``sign_flip_interval``'s sign patterns of n pairs (read-only, shared by its calls):
    ``(signs, v, order, cuts)``, ``v`` each pattern's sum of signs, ``order`` the patterns
    sorted by ``v`` (stable), ``cuts`` where each value of ``v`` begins in that order (and the
    end). Exact: all 2^n patterns, pattern r with -1 where r's bit j is set (column 0, dropped,
    keeps the memory layout of the doubling this replaced, so ``signs @ d`` rounds as before);
    else ``n_resamples`` random ones from ``seed``."""
    if exact:
        signs = np.ones((2**n, n + 1))
        signs[:, 1:] -= 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        signs = signs[:, 1:]
    else:
        signs = np.random.default_rng(seed).integers(0, 2, size=(n_resamples, n)) * 2.0 - 1
    v = signs.sum(axis=1)
    order = np.argsort(v, kind="stable")
    cuts = np.flatnonzero(np.diff(v[order], prepend=np.nan, append=np.nan))
    for x in (signs, v, order, cuts):
        x.flags.writeable = False
    return signs, v, order, cuts


def sign_flip_interval(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    exact_max: int = EXACT_MAX,
    n_resamples: int = 20_000,
    seed: int = 0,
) -> tuple[float, float]:
    """The sign-flip test inverted: every shift delta at which the sign-flip test of
    ``d_i - delta`` (``d = a - b``) gives p >= 1 - ``confidence`` (Lehmann's permutation
    interval for a symmetric paired difference). Every sign pattern up to ``exact_max`` pairs,
    else ``n_resamples`` random ones (the same for every delta; the ends then carry Monte Carlo
    error of about the resolution). Each end is found by bisection between the mean difference
    (p = 1) and +-max(1, max |d_i|), to 1e-6 (score units)."""
    _check_paired(a, b)
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n, alpha = d.size, 1 - confidence
    signs, v, order, cuts = _sign_patterns(n, n <= exact_max, n_resamples, seed)
    u, total = signs @ d, d.sum()  # pattern sum at delta: u - delta v
    tol = 1e-9 * (np.abs(d).sum() + n)
    # all 2^n patterns: grouped by v (n + 1 values), each group's u sorted. At one delta,
    # fl(u - delta v) is monotone in u within a group, so the patterns with |u - delta v| >= t
    # are a head and a tail of it, found by bisection with the same float operations as
    # np.abs(u - delta * v) >= t (the same count, 2 (n + 1) bisections instead of a pass over
    # every pattern at every delta; the random patterns are few: one pass)
    groups = None
    if n <= exact_max and np.isfinite(u).all():
        us = u[order]
        groups = [(v[order[i]], np.sort(us[i:j])) for i, j in zip(cuts[:-1], cuts[1:])]

    def p_at(delta: float) -> float:
        t = abs(total - n * delta) - tol
        if groups is None:
            return float(np.mean(np.abs(u - delta * v) >= t))
        if not t > 0:  # every pattern's |sum| is >= t
            return 1.0
        hits = 0
        for k, g in groups:
            c = delta * k
            hits += bisect.bisect_left(g, True, key=lambda x: x - c > -t)  # x - c <= -t
            hits += len(g) - bisect.bisect_left(g, True, key=lambda x: x - c >= t)
        return hits / len(u)

    def end(inside: float, outside: float) -> float:
        if p_at(outside) >= alpha:
            return outside
        while abs(outside - inside) > 1e-6:
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if p_at(mid) >= alpha else (inside, mid)
        return inside

    # scores in [0, 1] differ by at most 1; beyond the extreme differences every d_i - delta has
    # one sign and p = 2 / 2^n, so below 6 pairs the interval reaches the outer bound
    outer = max(1.0, float(np.abs(d).max()))
    mean = float(d.mean())
    return (end(mean, -outer), end(mean, outer))


def paired_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict:
    """A ``confidence`` interval of ``mean(a) - mean(b)`` on paired samples, without resampling
    for 0/1 scores: Tango's score interval (``tango_interval``); graded scores: the sign-flip
    test inverted (``sign_flip_interval``)."""
    _check_paired(a, b)
    if is_binary(a) and is_binary(b):
        n10 = sum(1 for x, y in zip(a, b) if x == 1 and y == 0)
        n01 = sum(1 for x, y in zip(a, b) if x == 0 and y == 1)
        lo, hi = tango_interval(n10, n01, len(a), confidence)
        method = "tango_score"
    else:
        lo, hi = sign_flip_interval(a, b, confidence)
        method = "sign_flip_inverted"
    return {"interval": method, "lo": lo, "hi": hi, "confidence": confidence}


def paired_test(a: Sequence[float], b: Sequence[float], seed: int = 0) -> dict:
    """The paired test of ``mean(a) - mean(b)``: McNemar's exact test when both score lists are
    0/1, the sign-flip test otherwise (``p_value``, ``resolution``: 0 when exact); ``n10`` /
    ``n01``: samples where ``a`` scored above / below ``b``."""
    if is_binary(a) and is_binary(b):
        return {**mcnemar_exact(a, b), "resolution": 0.0}
    t = sign_flip_test(a, b, seed=seed)
    return {**t, "n10": sum(x > y for x, y in zip(a, b)), "n01": sum(x < y for x, y in zip(a, b))}


def compare_paired(a: Sequence[float], b: Sequence[float], seed: int = 0) -> dict:
    """``mean(a) - mean(b)`` on paired samples: :func:`paired_test`; a 95% paired interval of
    the difference (``lo``, ``hi``, ``interval``: ``paired_interval``); ``mdd``, the minimum
    detectable difference at this n (``min_detectable_difference``)."""
    test = paired_test(a, b, seed=seed)
    ci = paired_interval(a, b)
    return {**test, "lo": ci["lo"], "hi": ci["hi"], "interval": ci["interval"],
            "mdd": min_detectable_difference(a, b)}  # fmt: skip


def newcombe_interval(
    x1: float, n1: int, x2: float, n2: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's (1998, method 10) hybrid score interval of ``x1/n1 - x2/n2``, two independent
    proportions: from each proportion's Wilson interval (l_i, u_i),
    ``lo = d - sqrt((p1 - l1)^2 + (u2 - p2)^2)``, ``hi = d + sqrt((u1 - p1)^2 + (p2 - l2)^2)``."""
    p1, p2 = x1 / n1, x2 / n2
    (l1, u1), (l2, u2) = wilson_interval(x1, n1, confidence), wilson_interval(x2, n2, confidence)
    d = p1 - p2
    return (d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2))


def compare_independent(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> dict:
    """``mean(a) - mean(b)`` for scores of different samples (a method under two data recipes):
    0/1 scores: Fisher's exact test (``scipy.stats.fisher_exact``, two-sided) and Newcombe's
    interval (``newcombe_interval``); graded: a two-sample permutation test of the difference of
    means (``scipy.stats.permutation_test``: two-sided p = twice the smaller tail; every split
    up to ``N_RESAMPLES`` of them, else that many random ones: ``resolution``) and Welch's t
    interval (``scipy.stats.ttest_ind``)."""
    from scipy import stats

    if not a or not b:
        raise ValueError(f"compare_independent needs scores on both sides, got {len(a)}, {len(b)}")
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    out = {"n_a": int(x.size), "n_b": int(y.size), "diff": float(x.mean() - y.mean()),
           "confidence": confidence, "resolution": 0.0}  # fmt: skip
    if is_binary(a) and is_binary(b):
        sa, sb = int(x.sum()), int(y.sum())
        table = [[sa, x.size - sa], [sb, y.size - sb]]
        lo, hi = newcombe_interval(sa, x.size, sb, y.size, confidence)
        return {**out, "test": "fisher_exact", "p_value": float(stats.fisher_exact(table).pvalue),
                "interval": "newcombe", "lo": lo, "hi": hi}  # fmt: skip
    res = stats.permutation_test((x, y), lambda u, w, axis=-1: u.mean(axis) - w.mean(axis),
                                 vectorized=True, n_resamples=N_RESAMPLES, rng=seed)  # fmt: skip
    splits = math.comb(x.size + y.size, x.size)
    if splits > N_RESAMPLES:
        out["resolution"] = 2 / (N_RESAMPLES + 1)
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(confidence)
    return {**out, "test": "permutation", "p_value": float(res.pvalue), "interval": "welch",
            "lo": float(ci.low), "hi": float(ci.high)}  # fmt: skip


def _check_paired(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"paired scores need the same non-zero length, got {len(a)} and {len(b)}")
