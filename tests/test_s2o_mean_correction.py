"""``mean_correction`` for S2O (a named variant, :mod:`s2o.mean_correction`): exact dense
attention where every skipped ranked tile holds one key and value repeated, the reference
against a per-row float64 loop, off by default (the same output as the paper's method, the
same decisions and density on), the Triton path refused naming the knob, the validation, and
the run configuration (a default run's keys and id unchanged, ``+method.`` adds it)."""

import math
from pathlib import Path

import pytest
import torch

import s2o
from s2o import s2o_attention, sparse_attention
from s2o.methods import bind
from s2o.methods.full import full_attention
from s2o.methods.s2o import DEFAULTS, OPTIONAL_KNOBS
from s2o.reference import s2o_permutations, s2o_reference

ROOT = Path(__file__).resolve().parents[1]
SEG, BLOCK = 32, 8


def _qkv(B, Hq, Hkv, L, D, seed, constant=False):
    """Random q, k, v; ``constant``: k and v repeat one random vector per ``BLOCK`` positions
    (a group's keys then rank next to each other and fill one ranked tile, since every ranked
    prefix is a multiple of ``BLOCK`` long), with the groups' scales spread so that attention
    is peaked and the early stop skips tiles that carry mass."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g)
    if not constant:
        return q, torch.randn(B, Hkv, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g)
    n = -(-L // BLOCK)
    k = torch.randn(B, Hkv, n, D, generator=g) * torch.rand(B, Hkv, n, 1, generator=g) * 2
    v = torch.randn(B, Hkv, n, D, generator=g)
    rep = lambda x: x.repeat_interleave(BLOCK, dim=2)[:, :, :L].contiguous()  # noqa: E731
    return q, rep(k), rep(v)


def _dense(q, k, v, causal):
    if causal:
        return full_attention(q, k, v, backend="math")
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, kr, vr)


KW = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, impl="reference")


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,knobs",
    [
        (2, 2, 2, 150, dict(tau=0.3)),
        (1, 4, 1, 157, dict(tau=0.3, stop_tile="discard")),  # the discarded tile is corrected
        (1, 4, 2, 128, dict(tau=0.1, local_window=8, q_perm=False)),
        (1, 4, 2, 150, dict(tau=0.3, tail_rank=20)),  # the tail walks (and pools) its own rank
        (1, 2, 1, 150, dict(tau=0.0, topk_ratio=0.3)),
        (1, 2, 1, 150, dict(tau=0.3, walk_budget=1)),
        (1, 2, 1, 96, dict(tau=0.3, causal=False)),
    ],
)
def test_exact_where_skipped_tiles_are_constant(B, Hq, Hkv, L, knobs):
    q, k, v = _qkv(B, Hq, Hkv, L, 16, seed=L, constant=True)
    dense = _dense(q, k, v, knobs.get("causal", True))
    plain, st = sparse_attention("s2o", q, k, v, **KW, **knobs)
    out, stc = sparse_attention("s2o", q, k, v, mean_correction=True, **KW, **knobs)
    pooled = stc.extra["pooled_tiles"]
    assert int(pooled.sum()) > 0, "no ranked tile skipped: nothing to test"
    e_plain, e_corr = float((plain - dense).abs().max()), float((out - dense).abs().max())
    assert e_plain > 1e-3, f"the plain walk is already dense (error {e_plain:.2e})"
    assert e_corr < 2e-5, f"corrected differs from dense by {e_corr:.3e} (plain: {e_plain:.3e})"
    assert torch.equal(st.tiles_processed, stc.tiles_processed), "density changed"
    assert torch.equal(st.extra["pass2_tiles"], stc.extra["pass2_tiles"]), "decisions changed"


def _loop(q, k, v, perms, visited):
    """Per (b, h, query row i), float64: Pass-1's keys ``[s, i]`` (``s`` the segment start; no
    window), the first ``visited x BLOCK`` keys of the segment's ranked prefix (``"keep"``:
    every visited tile was taken), and each further ranked tile of ``BLOCK`` keys of the prefix
    as ``BLOCK`` copies of its mean key and mean value."""
    q_idx, kv_idx = perms
    B, Hq, L, D = q.shape
    group = Hq // k.shape[1]
    out = torch.zeros(B, Hq, L, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kk, vv = k[b, h // group].double(), v[b, h // group].double()
            for i in range(L):
                s, qi = i // SEG * SEG, q[b, h, i].double()
                slot = int((q_idx[b, h, s : s + SEG] == i).nonzero())
                took = int(visited[b, h, s // BLOCK + slot // BLOCK]) * BLOCK
                ranked = kv_idx[b, h, i // SEG, :s].tolist()  # P_n = s (causal, no window)
                keys = list(range(s, i + 1)) + ranked[:took]
                logits = [float(qi @ kk[j]) / math.sqrt(D) for j in keys]
                values = [vv[j] for j in keys]
                for t0 in range(took, s, BLOCK):
                    tile = ranked[t0 : t0 + BLOCK]
                    logits.append(float(qi @ kk[tile].mean(0)) / math.sqrt(D) + math.log(BLOCK))
                    values.append(vv[tile].mean(0))
                w = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                out[b, h, i] = w @ torch.stack(values)
    return out


@pytest.mark.parametrize("B,Hq,Hkv,L", [(2, 2, 2, 77), (1, 4, 1, 100), (1, 8, 2, 70)])
def test_reference_equals_per_row_loop(B, Hq, Hkv, L):
    """Random keys (the means are not the keys): the reference's merge against the loop."""
    q, k, v = _qkv(B, Hq, Hkv, L, 16, seed=L)
    perms = s2o_permutations(q, k, SEG)
    geometry = dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK)
    out, st = s2o_reference(q, k, v, tau=0.3, perms=perms, mean_correction=True, **geometry)
    assert int(st.extra["pooled_tiles"].sum()) > 0
    want = _loop(q, k, v, perms, st.extra["pass2_tiles"])
    err = float((out.double() - want).abs().max())
    assert err < 1e-5, f"reference differs from the per-row loop by {err:.3e}"


def test_off_by_default_and_false_is_the_papers_method():
    """Default False; explicitly False gives the same bytes as the default, and on, the same
    Step 1 (the correction runs in ``attend``, its time is the attention's)."""
    assert DEFAULTS["mean_correction"] is False
    q, k, v = _qkv(2, 4, 2, 150, 16, seed=1)
    a, sa = sparse_attention("s2o", q.half(), k.half(), v.half(), tau=0.2, **KW)
    b, sb = sparse_attention("s2o", q.half(), k.half(), v.half(), tau=0.2, mean_correction=False,
                             **KW)  # fmt: skip
    assert torch.equal(a, b) and torch.equal(sa.tiles_processed, sb.tiles_processed)
    assert "pooled_tiles" not in sa.extra
    off, on = bind("s2o", tau=0.2, **KW), bind("s2o", tau=0.2, mean_correction=True, **KW)
    for x, y in zip(off.estimate(q, k, v), on.estimate(q, k, v), strict=True):
        assert torch.equal(x, y)
    _, st = on(q, k, v, timing=True)
    assert st.time_attention_ms is not None and st.time_attention_ms > 0


def test_nothing_skipped_nothing_corrected():
    """tau=0 walks every ranked tile: the correction adds nothing (dense attention)."""
    q, k, v = _qkv(1, 4, 2, 100, 16, seed=2)
    out, st = sparse_attention("s2o", q, k, v, tau=0.0, mean_correction=True, **KW)
    assert int(st.extra["pooled_tiles"].sum()) == 0
    err = float((out - full_attention(q, k, v, backend="math")).abs().max())
    assert err < 1e-5, err


@pytest.mark.parametrize(
    "knobs, match",
    [
        (dict(mean_correction="yes"), r"mean_correction must be a bool.*got 'yes'"),
        (dict(mean_correction=1), r"mean_correction must be a bool.*got 1"),
        (dict(mean_correction=None), r"mean_correction must be a bool.*got None"),
        (dict(mean_correction=True, impl="triton"),
         r"mean_correction=True .*reference path only.*impl resolves to 'triton'"),
    ],
)  # fmt: skip
def test_knob_is_validated_naming_the_value(knobs, match):
    with pytest.raises(ValueError, match=match):
        bind("s2o", **knobs)
    q, k, v = _qkv(1, 2, 1, 40, 16, seed=3)
    with pytest.raises(ValueError, match=match):
        s2o_attention(q, k, v, **{**KW, **knobs})


def test_triton_path_refused_when_auto_resolves_to_it(monkeypatch):
    """impl='auto' on CUDA tensors resolves to the kernels: refused at the call (Step 1 and
    Pass-2 alike), never run without the correction."""
    import s2o.methods.s2o as method

    monkeypatch.setattr(method, "resolve_impl", lambda impl, device: "triton")
    q, k, v = _qkv(1, 2, 1, 40, 16, seed=4)
    bound = bind("s2o", tau=0.1, mean_correction=True, **{**KW, "impl": "auto"})
    match = r"mean_correction=True .*impl='auto' with CUDA tensors"
    with pytest.raises(ValueError, match=match):
        bound(q, k, v)
    with pytest.raises(ValueError, match=match):
        bound.attend(q, k, v, s2o_permutations(q, k, SEG))


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    import run
    from experiments.common import resolved_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    return resolved_config(run.prepare(cfg), run.job_context(cfg))


def test_run_config_default_has_no_knob_and_plus_adds_it():
    """A default run's method block (so its run id) is what it was before the knob."""
    from experiments import records

    assert "mean_correction" in OPTIONAL_KNOBS
    base = _compose(["method=s2o"])
    assert set(base["method"]) == set(DEFAULTS) - set(OPTIONAL_KNOBS)
    on = _compose(["method=s2o", "+method.mean_correction=true"])
    assert on["method"]["mean_correction"] is True
    drop = records.drop_for("operator")
    assert records.config_id(base, drop) != records.config_id(on, drop)
    assert s2o.METHODS["s2o"].validate(dict(on["method"]))["mean_correction"] is True
