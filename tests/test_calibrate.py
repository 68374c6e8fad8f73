"""eval/calibrate.py: the generator's statistics pooled over several draws (the fit's objective)."""

import pytest


def test_synthetic_stats_pool_the_heads_of_several_draws():
    """One seed gives that draw's medians over heads; several pool their heads, each draw a
    "layer": every median lies between the draws' own, and ``head_spread`` is the median over
    draws (of two: the lower)."""
    from eval.calibrate import STATS, layer_stats, median_stats, synthetic_stats
    from eval.synthetic import SyntheticSpec, synthetic_qkv

    knobs = {"topics": 3.0, "topic_frac": 0.1, "drift": 4.0, "drift_len": 100.0, "head_temp": 0.3}
    shape = dict(L=1536, heads_q=3, heads_kv=1, head_dim=64)
    one = {}
    for seed in (0, 1):
        q, k, _ = synthetic_qkv(SyntheticSpec(seed=seed, **shape, **knobs))
        one[seed] = median_stats(layer_stats(q, k))
        assert synthetic_stats(knobs, 1536, 3, 1, 64, (seed,)) == one[seed]
    assert one[0] != one[1]  # the draws differ, or pooling them would test nothing
    both = synthetic_stats(knobs, 1536, 3, 1, 64, (0, 1))
    assert set(both) == set(STATS)
    for s in STATS:
        lo, hi = sorted((one[0][s], one[1][s]))
        assert lo - 1e-9 <= both[s] <= hi + 1e-9, (s, both[s], lo, hi)
    # head_spread: the median over the two draws (torch's median: the lower of the two)
    assert both["head_spread"] == pytest.approx(min(one[0]["head_spread"], one[1]["head_spread"]))
    with pytest.raises(ValueError, match="seeds"):
        synthetic_stats(knobs, 1536, 3, 1, 64, ())
