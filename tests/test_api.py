"""Every invalid input to the public API raises a ValueError that names the bad value."""

import pytest
import torch

import s2o
from s2o import s2o_attention, sparse_attention


def qkv(B=1, Hq=4, Hkv=2, L=64, D=16, dtype=torch.float32):
    return (
        torch.randn(B, Hq, L, D, dtype=dtype),
        torch.randn(B, Hkv, L, D, dtype=dtype),
        torch.randn(B, Hkv, L, D, dtype=dtype),
    )


SMALL = dict(segment_len=32, block_m=16, block_n=16)


def call(q, k, v, **kw):
    return s2o_attention(q, k, v, **{**SMALL, **kw})


BAD_TENSORS = [
    ("rank", lambda q, k, v: (q[0], k, v), r"rank 4.*\(16, 64, 16\)|rank 3"),
    ("k rank", lambda q, k, v: (q, k[..., None], v), r"k must have rank 4"),
    ("dtype mismatch", lambda q, k, v: (q, k.half(), v), r"dtype mismatch.*float16"),
    ("unsupported dtype", lambda q, k, v: (q.double(), k.double(), v.double()), r"float64"),
    ("int dtype", lambda q, k, v: (q.int(), k.int(), v.int()), r"int32"),
    ("device mismatch", lambda q, k, v: (q, k.to("meta"), v), r"device mismatch.*meta"),
    ("lengths", lambda q, k, v: (q[:, :, :32], k, v), r"L=32.*L=64"),
    ("head dims", lambda q, k, v: (q[..., :8], k, v), r"D=8.*D=16"),
    ("gqa", lambda q, k, v: (q[:, :3], k, v), r"Hq=3.*Hkv=2"),
    ("k/v shapes", lambda q, k, v: (q, k, v[:, :1]), r"k and v shapes differ"),
    ("batch", lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])), r"batch sizes differ"),
    ("not a tensor", lambda q, k, v: (q.tolist(), k, v), r"q must be a torch.Tensor"),
]


@pytest.mark.parametrize("name,mutate,pattern", BAD_TENSORS, ids=[b[0] for b in BAD_TENSORS])
def test_bad_tensors(name, mutate, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(*mutate(*qkv()))


BAD_KNOBS = [
    (dict(segment_len=40), r"segment_len=40 must be a multiple of block_m=16"),
    (dict(segment_len=48, block_n=32), r"segment_len=48.*block_n=32"),
    (dict(segment_len=0), r"segment_len must be a positive int, got 0"),
    (dict(block_m=-16), r"block_m must be a positive int, got -16"),
    (dict(block_n=16.0), r"block_n must be a positive int, got 16.0"),
    (dict(tau=float("nan")), r"tau must be a finite number, got nan"),
    (dict(tau=float("inf")), r"tau must be a finite number, got inf"),
    (dict(tau="0.1"), r"tau must be a finite number, got '0.1'"),
    (dict(local_window=8), r"local_window=8 must be a multiple of block_n=16"),
    (dict(local_window=-16), r"local_window must be an int >= 0, got -16"),
    (dict(variant="single"), r"variant='single' is not one of"),
    (dict(impl="cuda"), r"impl='cuda' is not one of"),
    (dict(variant="fused", q_perm=True), r"fused.*q_perm=True"),
    (dict(q_perm="yes"), r"q_perm must be a bool or None, got 'yes'"),
    (dict(scale=float("nan")), r"scale must be a finite number"),
    (dict(walk_budget=-1), r"walk_budget must be None or an int >= 0, got -1"),
    (dict(walk_budget=1.5), r"walk_budget must be None or an int >= 0, got 1.5"),
    (dict(stop_tile="drop"), r"stop_tile='drop' is not one of \['keep', 'discard'\]"),
]


@pytest.mark.parametrize("kw,pattern", BAD_KNOBS, ids=[str(b[0]) for b in BAD_KNOBS])
def test_bad_knobs(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(*qkv(), **kw)


def test_triton_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"impl='triton' needs CUDA tensors.*cpu"):
        call(*qkv(), impl="triton")


def test_auto_on_cpu_uses_reference():
    q, k, v = qkv()
    a = call(q, k, v, impl="auto", tau=0.01)
    b = call(q, k, v, impl="reference", tau=0.01)
    assert torch.equal(a, b)


def test_return_types():
    q, k, v = qkv(B=2)
    out = call(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    out, stats = call(q, k, v, return_stats=True)
    assert isinstance(stats, s2o.AttentionStats)
    assert isinstance(stats.sparsity, float)
    assert stats.sparsity_per_head.shape == (2, 4)
    summary = stats.summary()
    assert set(summary) >= {"sparsity", "density", "block_m", "block_n"}


def test_custom_scale_is_used():
    q, k, v = qkv()
    a = call(q, k, v, tau=0.0, scale=0.5)
    b = call(q * 2, k, v, tau=0.0, scale=0.25)
    assert (a - b).abs().max().item() < 1e-5
    c = call(q, k, v, tau=0.0)
    assert (a - c).abs().max().item() > 1e-3


def test_sparse_attention_unknown_method_and_knob():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"unknown method 'flash'.*'full'.*'s2o'"):
        sparse_attention("flash", q, k, v)
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['taus'\].*valid knobs:.*'tau'"):
        sparse_attention("s2o", q, k, v, taus=0.1)
    with pytest.raises(ValueError, match=r"backend='fa3' is not one of"):
        sparse_attention("full", q, k, v, backend="fa3")


def test_sparse_attention_s2o_matches_api_and_times():
    q, k, v = qkv()
    out, stats = sparse_attention("s2o", q, k, v, timing=True, **SMALL, tau=0.02)
    want, want_stats = call(q, k, v, tau=0.02, return_stats=True)
    assert torch.equal(out, want)
    assert stats.sparsity == want_stats.sparsity
    assert stats.time_estimate_ms is not None and stats.time_estimate_ms >= 0
    assert stats.time_attention_ms is not None and stats.time_attention_ms > 0


def test_s2o_attention_is_an_alias_of_the_method(monkeypatch):
    """One front door: ``s2o_attention``'s keywords are the S2O method's knobs (less the Triton-only
    ``step1_sort`` and ``launch``) with the same defaults, and every call goes through
    ``sparse_attention("s2o", ...)``."""
    import inspect

    from s2o.methods.s2o import DEFAULTS

    params = inspect.signature(s2o_attention).parameters
    kw = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert {n: d for n, d in kw.items() if n != "return_stats"} == {
        n: d for n, d in DEFAULTS.items() if n not in ("step1_sort", "launch")
    }
    calls = []
    monkeypatch.setattr(
        s2o.api,
        "sparse_attention",
        lambda *a, **k: calls.append((a[0], k)) or sparse_attention(*a, **k),
    )
    call(*qkv(), tau=0.02, walk_budget=2)
    assert calls == [("s2o", {**{n: kw[n] for n in kw if n in DEFAULTS}, **SMALL, "tau": 0.02,
                              "walk_budget": 2})]  # fmt: skip


def test_full_method_is_dense_with_zero_sparsity():
    q, k, v = qkv()
    out, stats = sparse_attention("full", q, k, v)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=True)
    assert (out - want).abs().max().item() < 1e-5
    assert stats.sparsity == 0.0


def test_bind_validates_once_and_matches_sparse_attention():
    from s2o.methods import bind

    q, k, v = (torch.randn(1, h, 300, 16) for h in (4, 2, 2))
    bound = bind("s2o", segment_len=128, tau=0.01, block_m=32, block_n=32)
    assert bound.knobs["q_perm"] is True and isinstance(bound.knobs["tau"], float)
    out, st = bound(q, k, v)
    ref, st_ref = sparse_attention(
        "s2o", q, k, v, segment_len=128, tau=0.01, block_m=32, block_n=32
    )
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert st.sparsity == st_ref.sparsity
    out2, _ = bound(q, k, v, scale=0.5)
    assert not torch.equal(out2, out)
    with pytest.raises(ValueError, match="scale"):
        bound(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="knob"):
        bind("s2o", taux=1)
    with pytest.raises(ValueError, match="method must be a str"):
        bind(["s2o"])


@pytest.mark.interpreter
def test_launch_knob_travels_in_the_bound_configuration():
    """Launch settings are knobs of the bound method (no module state); the Triton path with
    them equals the reference."""
    from s2o.methods import bind

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, h, 160, 16) for h in (2, 1, 1))
    knobs = dict(segment_len=64, block_m=32, block_n=32, tau=0.05)
    ref, st_ref = bind("s2o", impl="reference", **knobs)(q, k, v)
    bound = bind("s2o", impl="triton", launch={"pass2": {"num_warps": 2, "num_stages": 1}}, **knobs)
    assert bound.knobs["launch"] == {"pass2": {"num_warps": 2, "num_stages": 1}}
    out, st = bound(q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(st.tiles_processed, st_ref.tiles_processed)
    pbs = dict(block_size=32, segment_size=64)
    ref_b, _ = bind("pbs", impl="reference", **pbs)(q, k, v)
    out_b, _ = bind("pbs", impl="triton", launch={"num_warps": 2}, **pbs)(q, k, v)
    torch.testing.assert_close(out_b, ref_b, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="launch.pass2.num_warps"):
        bind("s2o", launch={"pass2": {"num_warps": 0}})
