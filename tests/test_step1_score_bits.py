"""Step 1's ``score_bits`` variant: ``kv_perm`` ranked by the top bits of each score's
order-preserving image (:func:`s2o.reference.score_buckets`), ties in ascending position, so that
one CUB sort of ``row << score_bits | bits`` ranks every row of a sort group.

The reference defines it; the Triton key kernels (under the interpreter; on the CPU the CUB sort
is ``torch.sort`` of the same packed keys) must give the reference's indices, with the key-score
kernel's packed keys and with the fp32 product's. Inputs are multiples of 1/4, so every score is
exact in both and 16-bit buckets really tie.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from s2o.kernels import s2o_step1
from s2o.reference import s2o_permutations, score_buckets

pytestmark = pytest.mark.interpreter


def _exact(shape, gen):
    return torch.randint(-8, 9, shape, generator=gen).float() / 4


def test_buckets_are_monotone_and_32_bits_keep_the_exact_order(gen):
    x = torch.randn(4000, generator=gen) * torch.exp(torch.randn(4000, generator=gen) * 10)
    edge = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-38, -1e-38, 3e38, -3e38])
    x = torch.cat([x, edge]).sort().values
    for bits in (16, 24, 32):
        b = score_buckets(x, bits)
        assert b.dtype == torch.int64 and int(b.min()) >= 0 and int(b.max()) < 2**bits
        assert bool((b[1:] >= b[:-1]).all()), bits  # a larger score never gets a smaller bucket
    b32 = score_buckets(x, 32)
    same = x[1:] == x[:-1]  # only equal scores (+0.0 and -0.0 among them) share a 32-bit key
    assert torch.equal(b32[1:] == b32[:-1], same)
    assert int(score_buckets(torch.tensor([float("nan")]), 16)) == 2**16 - 1
    # bf16 spacing near 1: 1 and 1 + 2**-9 share a 16-bit bucket, 1 + 2**-7 does not
    b16 = score_buckets(torch.tensor([1.0, 1.0 + 2**-9, 1.0 + 2**-7]), 16).tolist()
    assert b16[0] == b16[1] < b16[2]


def test_reference_ranks_buckets_descending_ties_by_position(gen):
    L, S = 768, 256
    q, k = torch.randn(1, 2, L, 16, generator=gen), torch.randn(1, 1, L, 16, generator=gen)
    _, exact = s2o_permutations(q, k, S)
    _, ranked = s2o_permutations(q, k, S, score_bits=16)
    assert torch.equal(s2o_permutations(q, k, S, score_bits=32)[1], exact)
    kf = k.float().repeat_interleave(2, dim=1)
    ties = 0
    for n in range(1, L // S):
        P = n * S
        row = ranked[0, :, n, :P]
        assert torch.equal(row.sort(dim=-1).values, torch.arange(P).expand(2, P))  # a permutation
        q_mean = q[:, :, n * S : (n + 1) * S].float().mean(dim=2)
        scores = torch.einsum("bhd,bhld->bhl", q_mean, kf[:, :, :P])[0]
        buckets = score_buckets(scores, 16).gather(1, row)
        assert bool((buckets[:, 1:] <= buckets[:, :-1]).all())  # descending buckets
        tie = buckets[:, 1:] == buckets[:, :-1]
        assert bool((row[:, 1:] > row[:, :-1])[tie].all())  # ties: ascending position
        ties += int(tie.sum())
        assert (ranked[0, :, n, P:] == -1).all()
    assert ties > 0  # 16 bits do tie on this input


@pytest.fixture(params=["one-group", "many-groups"])
def step1_groups(request, monkeypatch):
    step1 = importlib.import_module("s2o.kernels.step1_sort")
    if request.param == "many-groups":
        monkeypatch.setattr(step1, "_MIN_GROUP_KEYS", 1)
    return request.param


@pytest.mark.parametrize("bits", [16, 24])
@pytest.mark.parametrize("fused", [False, True], ids=["fp32-product", "key-score-kernel"])
@pytest.mark.parametrize(
    "B,Hq,Hkv,L,D,S,W", [(1, 4, 2, 100, 16, 32, 0), (2, 4, 1, 136, 16, 32, 32)], ids=["gqa", "win"]
)
def test_cub_with_score_bits_equals_reference(B, Hq, Hkv, L, D, S, W, fused, bits, gen,
                                              step1_groups):  # fmt: skip
    q, k = _exact((B, Hq, L, D), gen), _exact((B, Hkv, L, D), gen)
    qp, kvp = s2o_step1(q, k, segment_len=S, local_window=W, sort_mode="cub", score_bits=bits,
                        index_dtype=torch.int32, fused_scores=fused)  # fmt: skip
    rqp, rkvp = s2o_permutations(q, k, S, W, score_bits=bits)
    assert torch.equal(qp, rqp)
    kvp = kvp.long()
    assert torch.equal(kvp, rkvp), f"kv_perm differs at {(kvp != rkvp).nonzero()[:5].tolist()}"
    _, exact = s2o_permutations(q, k, S, W)
    if bits == 16:
        assert not torch.equal(kvp, exact)  # the variant is not the exact ranking here


def test_groups_leave_room_for_the_row_beside_the_score():
    step1 = importlib.import_module("s2o.kernels.step1_sort")
    prefix = [n * 2048 for n in range(64)]
    for bits, rows in ((24, 100), (16, 3000), (32, 100)):
        groups = step1._sort_groups(prefix, rows, "cub", min_keys=1, score_bits=bits)
        assert groups[0][0] == 1 and groups[-1][1] == 64
        if bits < 32:
            assert all((b - a) * rows <= 2 ** (32 - bits) for a, b in groups), (bits, groups)
    # 24 bits leave 8 for the row: two segments of 100 rows fit (200 <= 256), three do not
    assert len(step1._sort_groups(prefix, 100, "cub", score_bits=24)) == 32


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"score_bits": 20}, "score_bits must be one of"),
        ({"score_bits": 16}, "needs sort_mode='cub'"),
        ({"score_bits": 16, "sort_mode": "chunks"}, "needs sort_mode='cub'"),
        ({"score_bits": 16, "sort_mode": "cub", "causal": False}, "causal=True"),
        ({"score_bits": 16, "sort_mode": "cub", "tail_rank": 16}, "no tail_rank"),
    ],
)
def test_bad_settings_are_refused_naming_them(kw, match, gen):
    q, k = _exact((1, 2, 64, 16), gen), _exact((1, 1, 64, 16), gen)
    with pytest.raises(ValueError, match=match):
        s2o_step1(q, k, segment_len=32, **kw)
    with pytest.raises(ValueError, match="causal prefix without tail_rank"):
        s2o_permutations(q, k, 32, causal=False, score_bits=16)


def test_the_method_knob_is_optional_and_ranks_as_the_reference(gen):
    """``step1_score_bits`` is an optional S2O knob (absent from a default run's config): at 16
    the reference path's Step 1 is the reference ranking by buckets, so the attention equals
    ``s2o_reference`` on those perms; the settings it cannot take are refused at bind, naming
    them."""
    import s2o
    from s2o.methods.s2o import DEFAULTS, OPTIONAL_KNOBS
    from s2o.reference import s2o_reference

    assert "step1_score_bits" in OPTIONAL_KNOBS and DEFAULTS["step1_score_bits"] == 32
    L, S = 256, 64
    q = torch.randn(1, 2, L, 16, generator=gen)
    k, v = torch.randn(1, 1, L, 16, generator=gen), torch.randn(1, 1, L, 16, generator=gen)
    knobs = dict(segment_len=S, block_m=16, block_n=16, tau=0.01, impl="reference")
    out, _ = s2o.sparse_attention("s2o", q, k, v, step1_score_bits=16, **knobs)
    perms = s2o_permutations(q, k, S, score_bits=16)
    want, _ = s2o_reference(q, k, v, segment_len=S, local_window=0, block_m=16, block_n=16,
                            tau=0.01, q_perm=True, perms=perms)  # fmt: skip
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    bind = s2o.METHODS["s2o"].validate
    with pytest.raises(ValueError, match="step1_score_bits must be one of"):
        bind({**DEFAULTS, "step1_score_bits": 20})
    with pytest.raises(ValueError, match="needs step1_sort='cub', got 'chunks'"):
        bind({**DEFAULTS, "step1_score_bits": 16, "impl": "triton"})
    with pytest.raises(ValueError, match="causal=True"):
        bind({**DEFAULTS, "step1_score_bits": 16, "causal": False})
    assert bind({**DEFAULTS, "step1_score_bits": 16, "impl": "triton", "step1_sort": "cub"})
