"""Uncertainty of benchmark scores: a 95% interval on one method's accuracy (Wilson for 0/1
scores, bootstrap for continuous ones) and a paired comparison of two methods scored on the same
samples (McNemar's exact test for 0/1 scores, a paired bootstrap otherwise).

With n = 16 to 50 samples per cell, a few points of accuracy are within noise: report these next
to every accuracy and every difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np


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
    """Paired bootstrap of ``mean(a) - mean(b)`` (the same resampled samples for both): interval
    and two-sided p = 2 * min(P(diff* <= 0), P(diff* >= 0)), capped at 1."""
    _check_paired(a, b)
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    p = min(1.0, 2 * min(float(np.mean(boots <= 0)), float(np.mean(boots >= 0))))
    return {
        "test": "paired_bootstrap",
        "n": int(d.size),
        "diff": float(d.mean()),
        "lo": float(np.quantile(boots, alpha)),
        "hi": float(np.quantile(boots, 1 - alpha)),
        "p_value": p,
    }


def compare_paired(a: Sequence[float], b: Sequence[float], seed: int = 0) -> dict:
    """McNemar's exact test when both score lists are 0/1, a paired bootstrap otherwise."""
    if is_binary(a) and is_binary(b):
        return mcnemar_exact(a, b)
    return paired_bootstrap(a, b, seed=seed)


def _check_paired(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"paired scores need the same non-zero length, got {len(a)} and {len(b)}")
