"""S2O's top-k mode (``topk_ratio``) in the reference: the per-query oracle, exact tile counts,
the decimal rounding of the ratio, dense at ratio 1, and the method knob's validation."""

import math

import pytest
import torch
from s2o_oracle import oracle_s2o, structured_qkv

from s2o import sparse_attention
from s2o.reference import s2o_reference
from s2o.stats import (
    dense_tile_count,
    s2o_pass1_tile_count,
    s2o_ranked_len,
    topk_walk_tiles,
)

CASES = [
    # (B, Hq, Hkv, L, D, S, bm, bn, W)
    (1, 2, 1, 100, 8, 32, 16, 8, 0),  # last segment of 4 rows, 8-key tiles
    (2, 4, 2, 77, 8, 32, 16, 16, 16),  # batch 2, GQA 2, local window
    (1, 2, 2, 20, 8, 32, 16, 16, 0),  # L < S: no ranked prefix at all (causal)
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("ratio", [0.05, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("case", CASES)
def test_topk_reference_matches_oracle(case, ratio, causal):
    B, Hq, Hkv, L, D, S, bm, bn, W = case
    q, k, v = structured_qkv(B, Hq, Hkv, L, D, seed=L + 3)
    kw = dict(segment_len=S, tau=0.0, block_m=bm, block_n=bn, local_window=W, causal=causal,
              topk_ratio=ratio)  # fmt: skip
    out, stats = s2o_reference(q, k, v, **kw)
    want, visited, _ = oracle_s2o(q, k, v, **kw)
    for (b, h), tiles in visited.items():
        assert stats.extra["pass2_tiles"][b, h].tolist() == tiles, (b, h)
    err = (out.double() - want).abs().max().item()
    assert err < 2e-5, f"ratio {ratio}: reference vs oracle max abs error {err:.3e}"


def _walk_by_hand(L, S, W, bm, bn, ratio, causal):
    """Tiles per query tile, written out from the definition with plain integer arithmetic."""
    out = []
    for s in range(0, L, S):
        e = min(s + S, L)
        lo = max(0, s - W)
        ranked_keys = lo if causal else L - (e - lo)
        ranked_tiles = -(-ranked_keys // bn)
        num, den = round(ratio * 1000), 1000  # the test ratios have at most 3 decimals
        out += [-(-num * ranked_tiles // den)] * (-(-(e - s) // bm))
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.7])
def test_topk_visits_exactly_the_ranked_share_and_counts_it(ratio, causal):
    """Every query tile visits exactly ceil(r x ranked tiles) key tiles (no early stop), and the
    density counts exactly the Pass-1 tiles plus those visits."""
    L, S, W, bm, bn = 150, 32, 16, 16, 16
    q, k, v = structured_qkv(1, 2, 1, L, 8, seed=9)
    _, stats = s2o_reference(q, k, v, segment_len=S, tau=0.0, block_m=bm, block_n=bn,
                             local_window=W, causal=causal, topk_ratio=ratio)  # fmt: skip
    want = _walk_by_hand(L, S, W, bm, bn, ratio, causal)
    assert stats.extra["pass2_tiles"][0, 0].tolist() == want
    assert stats.extra["pass2_tiles_max"].tolist() == want
    assert stats.extra["topk_ratio"] == ratio
    pass1 = s2o_pass1_tile_count(L, S, W, bm, bn, causal=causal)
    assert stats.tiles_processed[0, 0].item() == pass1 + sum(want)
    assert stats.density == (pass1 + sum(want)) / dense_tile_count(L, bm, bn, causal)


@pytest.mark.parametrize(
    "tiles,ratio,want",
    [
        (10, 0.7, 7),
        (10, 0.3, 3),
        (100, 0.07, 7),  # 0.07 * 100 = 7.000000000000001 in binary floating point
        (240, 0.05, 12),
        (3, 1 / 3, 1),
        (7, 1.0, 7),
        (7, 1e-9, 1),  # a non-empty prefix keeps at least one tile
        (0, 0.5, 0),
    ],
)
def test_topk_walk_tiles_reads_the_ratio_as_written(tiles, ratio, want):
    assert topk_walk_tiles(tiles, ratio) == want


def test_topk_ratio_one_with_tau_zero_is_dense_attention():
    q, k, v = structured_qkv(1, 4, 2, 90, 16, seed=2)
    for causal in (True, False):
        out, stats = s2o_reference(q, k, v, segment_len=32, tau=0.0, block_m=16, block_n=16,
                                   causal=causal, topk_ratio=1.0)  # fmt: skip
        kr, vr = (t.double().repeat_interleave(2, dim=1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q.double(), kr, vr,
                                                                is_causal=causal)  # fmt: skip
        err = (out.double() - want).abs().max().item()
        assert err < 1e-5, f"causal={causal}: {err:.3e}"
        assert stats.sparsity == 0.0


def test_topk_with_walk_budget_takes_the_smaller_cap():
    q, k, v = structured_qkv(1, 2, 1, 160, 8, seed=4)
    kw = dict(segment_len=32, tau=0.0, block_m=16, block_n=16, causal=False, topk_ratio=0.7)
    _, only = s2o_reference(q, k, v, **kw)
    _, both = s2o_reference(q, k, v, walk_budget=2, **kw)
    assert int(only.extra["pass2_tiles"].max()) == math.ceil(0.7 * (160 - 32) / 16) == 6
    assert both.extra["pass2_tiles"].tolist() == only.extra["pass2_tiles"].clamp(max=2).tolist()
    assert s2o_ranked_len(160, 0, 32, 0, causal=False) == 128


def test_topk_sparsity_falls_as_the_ratio_grows():
    q, k, v = structured_qkv(1, 2, 1, 256, 8, seed=6)
    dens = [
        s2o_reference(
            q, k, v, segment_len=32, tau=0.0, block_m=16, block_n=16, causal=False, topk_ratio=r
        )[1].density  # fmt: skip
        for r in (0.05, 0.2, 0.5, 1.0)
    ]
    assert dens == sorted(dens) and dens[0] < dens[-1] == 1.0, dens


SMALL = dict(segment_len=32, block_m=16, block_n=16, impl="reference")


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.1"])
def test_method_refuses_a_bad_topk_ratio_naming_it(bad):
    q, k, v = structured_qkv(1, 2, 1, 64, 8, seed=1)
    with pytest.raises(ValueError, match=rf"topk_ratio must be None or a number in \(0, 1\], got "
                                         rf"{repr(bad).replace('.', '[.]')}"):  # fmt: skip
        sparse_attention("s2o", q, k, v, tau=0.0, topk_ratio=bad, **SMALL)


def test_method_refuses_topk_with_early_stop_naming_both():
    q, k, v = structured_qkv(1, 2, 1, 64, 8, seed=1)
    with pytest.raises(ValueError, match=r"topk_ratio=0\.2 .* tau <= 0 \(got tau=0\.005\)"):
        sparse_attention("s2o", q, k, v, tau=0.005, topk_ratio=0.2, **SMALL)
    with pytest.raises(ValueError, match=r"tau must be <= 0, got tau=0\.1"):
        s2o_reference(q, k, v, segment_len=32, tau=0.1, block_m=16, block_n=16, topk_ratio=0.2)


def test_method_topk_knob_reaches_the_reference():
    q, k, v = structured_qkv(1, 2, 1, 100, 8, seed=8)
    out, stats = sparse_attention("s2o", q, k, v, tau=0.0, topk_ratio=0.3, causal=False, **SMALL)
    ref, rst = s2o_reference(q, k, v, segment_len=32, tau=0.0, block_m=16, block_n=16,
                             causal=False, topk_ratio=0.3)  # fmt: skip
    assert torch.equal(out, ref)
    assert torch.equal(stats.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    assert 0 < stats.sparsity < 1


def test_public_s2o_attention_takes_topk_ratio():
    from s2o import s2o_attention

    q, k, v = structured_qkv(1, 2, 1, 100, 8, seed=8)
    out, stats = s2o_attention(q, k, v, segment_len=32, tau=0.0, block_m=16, block_n=16,
                               causal=False, topk_ratio=0.3, return_stats=True)  # fmt: skip
    ref, rst = s2o_reference(q, k, v, segment_len=32, tau=0.0, block_m=16, block_n=16,
                             causal=False, topk_ratio=0.3)  # fmt: skip
    assert torch.equal(out, ref) and stats.sparsity == rst.sparsity
    with pytest.raises(ValueError, match=r"topk_ratio must be None or a number in \(0, 1\], got 2"):
        s2o_attention(q, k, v, segment_len=32, tau=0.0, block_m=16, block_n=16, topk_ratio=2)
    with pytest.raises(ValueError, match=r"tau must be <= 0, got tau=0\.01"):
        s2o_attention(q, k, v, segment_len=32, tau=0.01, block_m=16, block_n=16, topk_ratio=0.5)
