"""FlashPrefill v2's knobs on the CPU (s2o/methods/flashprefill.py, steps 6-8): the mean
correction's reference against a per-query float64 loop written from the official fp64 test's
description, what the correction changes (toward dense attention where pruned blocks carry mass,
nothing where nothing is pruned), the default left as it was, the knobs' validation, the layer
knob refused per call, and the run configuration (default identity unchanged, +method.* adds)."""

import math
from pathlib import Path

import pytest
import torch

import s2o
from s2o.methods import flashprefill as fp
from s2o.methods import resolve_knobs
from s2o.methods.blocksparse import attend
from s2o.methods.full import full_attention

ROOT = Path(__file__).resolve().parents[1]
PRUNE = dict(sink_blocks=0, local_blocks=1, dense_tail_tiles=0)  # only the best + the diagonal


def _qkv(B, Hq, Hkv, L, D, seed, q_scale=0.5, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g) * q_scale
    k = torch.randn(B, Hkv, L, D, generator=g)
    v = torch.randn(B, Hkv, L, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _plan(q, k, v, **knobs):
    m = s2o.METHODS["flashprefill"]
    return m.estimate(q, k, v, **{**m.defaults, "impl": "reference", **knobs})


def _loop(q, k, v, mask, bs):
    """Per (b, h, query i), float64: kept tokens ``j <= i`` exactly, and every pruned block ``J``
    ending before the query's tile (``J < i // bs``) as ``bs`` copies of its mean key and mean
    value (means rounded to the input dtype, as stored)."""
    B, Hq, L, D = q.shape
    G = Hq // k.shape[1]
    out = torch.zeros(B, Hq, L, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kk, vv = k[b, h // G].double(), v[b, h // G].double()
            nb = math.ceil(L / bs)
            km = [kk[j * bs : (j + 1) * bs].mean(0).to(k.dtype).double() for j in range(nb)]
            vm = [vv[j * bs : (j + 1) * bs].mean(0).to(v.dtype).double() for j in range(nb)]
            for i in range(L):
                t, qi = i // bs, q[b, h, i].double()
                logits, values = [], []
                for j in range(i + 1):
                    if mask[b, h, t, j // bs]:
                        logits.append(float(qi @ kk[j]) / math.sqrt(D))
                        values.append(vv[j])
                for J in range(t):
                    if not mask[b, h, t, J]:
                        logits.append(float(qi @ km[J]) / math.sqrt(D) + math.log(bs))
                        values.append(vm[J])
                w = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                out[b, h, i] = w @ torch.stack(values)
    return out


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,D,bs",
    [(2, 2, 2, 77, 16, 16), (1, 4, 1, 150, 16, 32), (2, 8, 2, 100, 8, 16)],  # GQA 1/4, batch 2
)
def test_reference_equals_per_query_loop(B, Hq, Hkv, L, D, bs):
    q, k, v = _qkv(B, Hq, Hkv, L, D, seed=L)
    plan = _plan(q, k, v, alpha=1.0, block_size=bs, **PRUNE)
    assert bool(fp.correction_blocks(plan.mask).any()), "no pruned block: nothing to test"
    got = fp.mean_corrected_reference(q, k, v, plan, None).double()
    want = _loop(q, k, v, plan.mask, bs)
    err = float((got - want).abs().max())
    assert err < 1e-5, f"reference differs from the per-query loop by {err:.3e}"


def test_correction_blocks_are_pruned_and_before_the_tile():
    q, k, v = _qkv(1, 2, 1, 300, 16, seed=1)
    plan = _plan(q, k, v, alpha=0.9, block_size=16, sink_blocks=1, local_blocks=2,
                 dense_tail_tiles=3)  # fmt: skip
    corr = fp.correction_blocks(plan.mask)
    nb = plan.mask.shape[-1]
    strictly_before = torch.ones(nb, nb, dtype=torch.bool).tril(-1)  # j < t
    assert not bool((corr & plan.mask).any()), "a kept block is corrected too"
    assert not bool((corr & ~strictly_before).any()), "a block on or after the diagonal"
    assert torch.equal(corr | plan.mask, fp.block_causal(nb, q.device).expand_as(corr))
    assert not bool(corr[..., -3:, :].any()), "a dense tail tile corrected"
    assert bool(corr.any())


def test_correction_moves_the_output_toward_dense():
    """Near-uniform attention (small logits): the pruned blocks carry most of the mass, and their
    mean key/value stand in for them well."""
    q, k, v = _qkv(2, 4, 1, 300, 16, seed=2)
    dense = full_attention(q, k, v, backend="math")
    knobs = dict(alpha=0.9, block_size=16, **PRUNE)
    plain, stats = s2o.sparse_attention("flashprefill", q, k, v, **knobs)
    corrected, stats_c = s2o.sparse_attention("flashprefill", q, k, v, mean_correction=True,
                                              **knobs)  # fmt: skip
    e_plain = float((plain - dense).norm() / dense.norm())
    e_corr = float((corrected - dense).norm() / dense.norm())
    assert e_corr < 0.5 * e_plain, f"relative error {e_corr:.4f} corrected, {e_plain:.4f} not"
    assert torch.equal(stats.tiles_processed, stats_c.tiles_processed), "density changed"


def _constant_blocks(B, Hq, Hkv, L, D, bs, seed, dtype=torch.float32):
    """q random; k and v one random vector per block of ``bs`` positions (the last block
    short), the blocks' key scales spread so that attention is peaked."""
    g = torch.Generator().manual_seed(seed)
    nb = math.ceil(L / bs)
    q = torch.randn(B, Hq, L, D, generator=g)
    k = torch.randn(B, Hkv, nb, D, generator=g) * torch.rand(B, Hkv, nb, 1, generator=g) * 2
    v = torch.randn(B, Hkv, nb, D, generator=g)
    rep = lambda x: x.repeat_interleave(bs, dim=2)[:, :, :L].to(dtype)  # noqa: E731
    return q.to(dtype), rep(k), rep(v)


@pytest.mark.parametrize("B,Hq,Hkv,L,bs", [(2, 2, 2, 150, 16), (1, 4, 1, 200, 32)])
def test_correction_is_exact_where_pruned_blocks_are_constant(B, Hq, Hkv, L, bs):
    """A pruned block whose tokens share one key and value is replaced by exactly what it
    contributes: the corrected output is dense attention, the plain one is not; the plan (Step
    1-4) and the density are the same with the knob on (the correction runs in attend)."""
    q, k, v = _constant_blocks(B, Hq, Hkv, L, 16, bs, seed=L)
    dense = full_attention(q, k, v, backend="math")
    knobs = dict(alpha=1.0, block_size=bs, **PRUNE)
    plan = _plan(q, k, v, **knobs)
    assert torch.equal(plan.mask, _plan(q, k, v, mean_correction=True, **knobs).mask)
    assert bool(fp.correction_blocks(plan.mask).any()), "no pruned block: nothing to test"
    plain, stats = s2o.sparse_attention("flashprefill", q, k, v, **knobs)
    out, stats_c = s2o.sparse_attention("flashprefill", q, k, v, mean_correction=True,
                                        timing=True, **knobs)  # fmt: skip
    e_plain, e_corr = float((plain - dense).abs().max()), float((out - dense).abs().max())
    assert e_plain > 1e-2, f"the plain plan is already dense (error {e_plain:.2e})"
    assert e_corr < 2e-5, f"corrected differs from dense by {e_corr:.3e} (plain: {e_plain:.3e})"
    assert torch.equal(stats.tiles_processed, stats_c.tiles_processed), "density changed"
    assert stats_c.time_attention_ms is not None and stats_c.time_attention_ms > 0


def test_nothing_pruned_nothing_corrected():
    q, k, v = _qkv(2, 4, 2, 200, 16, seed=3)
    plan = _plan(q, k, v, alpha=0.0, block_size=16)
    assert not bool(fp.correction_blocks(plan.mask).any())
    got = fp.mean_corrected_reference(q, k, v, plan, None)
    plain, _ = attend(q, k, v, plan, scale=None, impl="reference")
    err = float((got - plain).abs().max())
    assert err < 1e-6, f"alpha=0: corrected differs from plain by {err:.3e}"


def test_default_is_the_v1_path_bit_for_bit():
    """mean_correction=False (the default) runs the shared block-sparse attend, unchanged."""
    q, k, v = _qkv(2, 4, 2, 200, 16, seed=4, dtype=torch.float16)
    out, _ = s2o.sparse_attention("flashprefill", q, k, v, alpha=0.5, block_size=16)
    plan = _plan(q, k, v, alpha=0.5, block_size=16)
    want, _ = attend(q, k, v, plan, scale=None, impl="reference")
    assert torch.equal(out, want)
    assert s2o.METHODS["flashprefill"].defaults["mean_correction"] is False
    assert s2o.METHODS["flashprefill"].defaults["dense_first_layers"] == 0


@pytest.mark.parametrize(
    "knobs, match",
    [
        (dict(mean_correction="yes"), r"mean_correction must be a bool, got 'yes'"),
        (dict(mean_correction=1), r"mean_correction must be a bool, got 1"),
        (dict(dense_first_layers=-1), r"dense_first_layers must be an int >= 0, got -1"),
        (dict(dense_first_layers=2.0), r"dense_first_layers must be an int >= 0, got 2\.0"),
        (dict(dense_first_layers=True), r"dense_first_layers must be an int >= 0, got True"),
    ],
)
def test_v2_knobs_are_validated_naming_the_value(knobs, match):
    with pytest.raises(ValueError, match=match):
        s2o.methods.bind("flashprefill", alpha=0.1, **knobs)


def test_dense_first_layers_is_refused_per_call():
    """A single attention call has no layer index: the knob is refused, never ignored."""
    q, k, v = _qkv(1, 2, 1, 64, 16, seed=5)
    msg = r"dense_first_layers=4 chooses which layers of a model run 'flashprefill'.*sparse_prefill"
    with pytest.raises(ValueError, match=msg):
        s2o.sparse_attention("flashprefill", q, k, v, alpha=0.1, dense_first_layers=4)
    with pytest.raises(ValueError, match=msg):
        resolve_knobs("flashprefill", dict(alpha=0.1, dense_first_layers=4))
    bound = s2o.methods.bind("flashprefill", alpha=0.1, block_size=16, dense_first_layers=4)
    out, _ = bound.per_layer()(q, k, v)  # as the model plug-in calls it on a sparse layer
    assert bound.per_layer().config["dense_first_layers"] == 4 and out.shape == q.shape
    s2o.sparse_attention("flashprefill", q, k, v, alpha=0.1, dense_first_layers=0)


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    import run
    from experiments.common import resolved_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    return resolved_config(run.prepare(cfg), run.job_context(cfg))


def test_run_config_default_has_no_v2_keys_and_plus_adds_them():
    """A default run's method block (so its config_id) is what it was before the v2 knobs."""
    from experiments import records

    base = _compose(["method=flashprefill"])
    v1 = ("alpha", "block_size", "sink_blocks", "local_blocks", "dense_tail_tiles", "min_budget",
          "scale", "impl", "launch")  # fmt: skip
    assert set(base["method"]) == set(v1)
    v2 = _compose(["method=flashprefill", "+method.mean_correction=true",
                   "+method.dense_first_layers=4"])  # fmt: skip
    assert v2["method"]["mean_correction"] is True and v2["method"]["dense_first_layers"] == 4
    drop = records.drop_for("operator")
    assert records.config_id(base, drop) != records.config_id(v2, drop)
