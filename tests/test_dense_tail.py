"""``dense_tail`` (a named S2O variant, :mod:`s2o.dense_tail`): Step 1's tail ordering, the
reference (tail rows get exact dense attention, everything before the tail's segment is the
default method's), the Triton kernels against the reference (interpreter), and the refusals."""

import math

import pytest
import torch

from s2o import s2o_attention, sparse_attention
from s2o.dense_tail import forced_tiles, tail_last
from s2o.reference import s2o_permutations, s2o_reference

SEG, BLOCK = 32, 16


def _qkv(L, D=16, Hq=2, Hkv=1, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hq, L, D, generator=gen) * 1.5
    k = torch.randn(1, Hkv, L, D, generator=gen)
    v = torch.randn(1, Hkv, L, D, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _dense(q, k, v):
    group = q.shape[1] // k.shape[1]
    kd, vd = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = q.double() @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vd


def test_tail_last_moves_tail_rows_after_the_rest_in_position_order():
    L, T = 100, 40  # segments [0,32) [32,64) [64,96) [96,100): the tail [60,100) spans three
    gen = torch.Generator().manual_seed(1)
    qp = torch.cat([torch.randperm(32, generator=gen) + s for s in (0, 32, 64)]
                   + [torch.tensor([99, 97, 96, 98])]).view(1, 1, L)  # fmt: skip
    out = tail_last(qp, SEG, T)
    assert torch.equal(out[..., :32], qp[..., :32])  # no tail row: untouched
    for s in (32, 64, 96):
        e = min(s + SEG, L)
        got, src = out[0, 0, s:e].tolist(), qp[0, 0, s:e].tolist()
        assert sorted(got) == sorted(src), "not a permutation of the segment"
        head = [x for x in src if x < L - T]
        assert got == head + sorted(x for x in src if x >= L - T)
    # the tail occupies walk slots [L - T, L) exactly
    assert sorted(out[0, 0, L - T :].tolist()) == list(range(L - T, L))
    assert tail_last(qp, SEG, 0) is qp


def test_forced_tiles():
    # segment [64, 96) of L=100, tail from 90: slots 90.. are in local tile 1 (rows 16..31)
    assert list(forced_tiles(64, 32, 16, 100, 10)) == [1]
    assert list(forced_tiles(96, 4, 16, 100, 10)) == [0]
    assert list(forced_tiles(32, 32, 16, 100, 10)) == []
    assert list(forced_tiles(64, 32, 16, 100, 0)) == []
    assert list(forced_tiles(64, 32, 16, 100, 50)) == [0, 1]


@pytest.mark.parametrize("q_perm", [True, False])
def test_reference_tail_rows_are_dense_and_earlier_segments_unchanged(q_perm):
    L, T = 160, 20
    q, k, v = _qkv(L)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, q_perm=q_perm, tau=0.5)
    base, bst = s2o_reference(q, k, v, **kw)
    out, st = s2o_reference(q, k, v, dense_tail=T, **kw)
    dense = _dense(q, k, v)
    # the default drops mass in the tail at this tau (else the test would prove nothing)
    assert float((base[..., L - T :, :].double() - dense[..., L - T :, :]).abs().max()) > 1e-2
    assert float((out[..., L - T :, :].double() - dense[..., L - T :, :]).abs().max()) < 1e-5
    seg_of_tail = ((L - T) // SEG) * SEG
    assert torch.equal(out[..., :seg_of_tail, :], base[..., :seg_of_tail, :])
    # forced tiles walk the whole ranked prefix; the density pays for them
    full = st.extra["pass2_tiles_max"]
    n_tiles_per_seg = SEG // BLOCK
    last = st.extra["pass2_tiles"][..., -n_tiles_per_seg:]
    assert torch.equal(last, full[-n_tiles_per_seg:].expand_as(last))
    assert st.sparsity < bst.sparsity


def test_reference_tau_zero_unchanged_by_dense_tail():
    q, k, v = _qkv(96)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.0)
    a, sa = s2o_reference(q, k, v, **kw)
    b, sb = s2o_reference(q, k, v, dense_tail=24, **kw)
    assert float((a - b).abs().max()) < 1e-6
    assert torch.equal(sa.extra["pass2_tiles"], sb.extra["pass2_tiles"])


@pytest.mark.interpreter
@pytest.mark.parametrize("variant,q_perm", [("two_pass", True), ("two_pass", False),
                                            ("fused", False)])  # fmt: skip
@pytest.mark.parametrize("T", [1, 20, 70])
def test_kernels_match_reference(variant, q_perm, T):
    from s2o.kernels import s2o_triton

    L = 150
    q, k, v = _qkv(L, Hq=4, Hkv=2, seed=3, dtype=torch.float16)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, q_perm=q_perm, tau=0.3,
              dense_tail=T)  # fmt: skip
    ref, rst = s2o_reference(q, k, v, **kw)
    out = torch.full_like(q, float("nan"))
    # perms=None: s2o_triton applies the tail ordering itself
    got, st = s2o_triton(q, k, v, variant=variant, out=out, **kw)
    assert not got.isnan().any()
    assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    rel = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert rel < 2e-3, rel
    dense = _dense(q, k, v)
    tail_err = float((got[..., L - T :, :].double() - dense[..., L - T :, :]).abs().max())
    assert tail_err < 5e-3, tail_err


@pytest.mark.interpreter
def test_method_triton_path_equals_reference_path():
    q, k, v = _qkv(130, D=32, Hq=4, Hkv=2, seed=5)
    knobs = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.3, dense_tail=40)
    out, st = sparse_attention("s2o", q, k, v, impl="triton", **knobs)
    ref, rst = sparse_attention("s2o", q, k, v, impl="reference", **knobs)
    assert torch.equal(st.extra["pass2_tiles"], rst.extra["pass2_tiles"])
    assert float((out - ref).abs().max()) < 1e-4


def test_refusals_name_the_value():
    q, k, v = _qkv(64)
    kw = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, impl="reference")
    with pytest.raises(ValueError, match=r"dense_tail must be an int >= 0.*-1"):
        s2o_attention(q, k, v, dense_tail=-1, **kw)
    with pytest.raises(ValueError, match=r"dense_tail must be an int >= 0.*True"):
        sparse_attention("s2o", q, k, v, dense_tail=True, **kw)
    with pytest.raises(ValueError, match=r"dense_tail=8 .*topk_ratio=0\.5"):
        s2o_attention(q, k, v, dense_tail=8, tau=0.0, topk_ratio=0.5, **kw)
    with pytest.raises(ValueError, match=r"dense_tail=8 .*walk_budget=2"):
        sparse_attention("s2o", q, k, v, dense_tail=8, walk_budget=2, **kw)
    with pytest.raises(ValueError, match=r"dense_tail=8 .*causal=False"):
        s2o_attention(q, k, v, dense_tail=8, causal=False, **kw)


def test_permutations_with_dense_tail_equal_tail_last_of_default():
    q, k, _ = _qkv(100)
    qp, kvp = s2o_permutations(q, k, SEG)
    qp2, kvp2 = s2o_permutations(q, k, SEG, dense_tail=30)
    assert torch.equal(qp2, tail_last(qp, SEG, 30))
    assert torch.equal(kvp, kvp2)
