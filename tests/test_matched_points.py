"""analysis/matched_points.py on hand-made curves with known matched points: the monotone fit,
no extrapolation (a point outside says so), paired bootstrap over units, per-layer units, and
the make_all section (the Qwen set missing until its record is pinned)."""

from __future__ import annotations

import json
import math

import numpy as np
import yaml

from analysis import matched_points as mp
from analysis.records import paper_numbers
from analysis.sections import Ctx

GRID = [0.5, 0.6, 0.7, 0.8, 0.9]


def curve(mse_of, grid=GRID, knob=lambda s: s) -> list[dict]:
    return [{"knob": knob(s), "sparsity": s, "density": 1 - s, "mse": mse_of(s)} for s in grid]


def test_isotonic_pools_violators():
    assert np.allclose(mp.isotonic(np.array([1.0, 3.0, 2.0, 4.0])), [1, 2.5, 2.5, 4])
    assert np.allclose(mp.isotonic(np.array([3.0, 2.0, 1.0])), [2, 2, 2])


def test_mse_at_interpolates_log_linear_and_refuses_outside():
    c = mp.fit(curve(lambda s: math.exp(10 * s)))
    v, flag = mp.mse_at(c, 0.65)
    assert flag == "ok" and math.isclose(v, math.exp(6.5), rel_tol=1e-9), v
    assert mp.mse_at(c, 0.95) == (None, "sparser")
    assert mp.mse_at(c, 0.45) == (None, "denser")


def test_density_at_inverts_and_bounds():
    c = mp.fit(curve(lambda s: math.exp(10 * s)))
    d, flag = mp.density_at(c, math.exp(7.5))
    assert flag == "ok" and math.isclose(d, 0.25, rel_tol=1e-9), d
    assert mp.density_at(c, math.exp(4.0)) == (0.5, "gt")  # below its densest point's MSE
    assert mp.density_at(c, math.exp(9.5)) == (None, "le")  # above its sparsest point's MSE


def test_non_monotone_points_are_fitted_monotone():
    pts = curve(lambda s: {0.5: 1.0, 0.6: 3.0, 0.7: 2.0, 0.8: 4.0, 0.9: 5.0}[s])
    s, y = mp.fit(pts)
    assert (np.diff(y) >= 0).all(), y


def units_pair(n: int, factor: float = 2.0) -> dict:
    """n units whose baseline MSE is ``factor`` x S2O's at every sparsity, the units unlike one
    another (another scale and knob -> sparsity map each)."""
    s2o, base = [], []
    for i in range(n):
        f = lambda s, i=i: (1 + i) * math.exp(8 * s)  # noqa: E731
        grid = [g - 0.02 * i for g in GRID]
        s2o.append(curve(f, grid, knob=lambda s, i=i: s + 0.02 * i))
        base.append(curve(lambda s, f=f: factor * f(s), grid, knob=lambda s, i=i: s + 0.02 * i))
    return {"s2o": s2o, "b": base}


def test_paired_bootstrap_keeps_an_exact_ratio():
    res = mp.analyse(units_pair(3), [0.6, 0.7], n_boot=200)
    rows = [r for r in res["rows"] if r["quantity"] == "mse" and r["baseline"] == "b"]
    for r in rows:
        assert math.isclose(r["ratio"], 2.0, rel_tol=1e-9), r
        assert r["ci"] is not None and np.allclose(r["ci"], 2.0), r["ci"]


def test_density_at_matched_mse_of_a_shifted_curve():
    """The baseline needs 0.1 more density for the same MSE: ratio (d + 0.1) / d; at a target
    sparsity past its sparsest point it has no MSE (no extrapolation)."""
    s2o = curve(lambda s: math.exp(10 * s), [0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    base = curve(lambda s: math.exp(10 * (s + 0.1)), [0.4, 0.5, 0.6, 0.7, 0.8])
    res = mp.analyse({"s2o": [s2o], "b": [base]}, [0.85], n_boot=0)
    dens = next(r for r in res["rows"] if r["quantity"] == "density" and r["baseline"] == "b")
    assert math.isclose(dens["ratio"], 0.25 / 0.15, rel_tol=1e-9), dens
    assert dens["ci"] is None  # one unit: no interval
    mse = next(r for r in res["rows"] if r["quantity"] == "mse" and r["baseline"] == "b")
    assert mse["ratio"] is None and mse["cell"] == (None, "sparser"), mse
    assert mp._cell(mse, res["est"]) == "outside: measured 0.400-0.800"


def test_best_baseline_is_unknown_when_a_baseline_may_be_lower():
    cells_ok = [(0.3, "ok"), (0.5, "gt")]  # the second needs more than 0.5 > 0.3: not the best
    assert mp.best(cells_ok, "density") == 0.3
    assert mp.best([(0.3, "ok"), (0.2, "gt")], "density") is None
    assert mp.best([(0.3, "ok"), (None, "le")], "density") is None
    assert mp.best([(1e-3, "ok"), (None, "sparser")], "mse") == 1e-3  # does not run there
    assert mp.best([(1e-3, "ok"), (None, "denser")], "mse") is None


def record(methods: dict, targets=(0.6, 0.7), layers: bool = False) -> dict:
    """A kind=matched record as experiments/matched.py writes it; ``layers``: per-layer points."""
    out = {}
    for name, units in methods.items():
        pts = []
        for j in range(len(units[0])):
            mean = {k: float(np.mean([u[j][k] for u in units])) for k in ("sparsity", "mse")}
            p = {"knob": units[0][j]["knob"], **mean, "density": 1 - mean["sparsity"], "mae": 0.0}
            if layers:
                p["layers"] = [{"layer": i, **{k: u[j][k] for k in ("sparsity", "mse")}}
                               for i, u in enumerate(units)]  # fmt: skip
            pts.append(p)
        out[name] = {"status": "ok", "curve": pts}
    return {"status": "ok", "kind": "matched", "method": "s2o",
            "config": {"matched": {"target_sparsity": list(targets)},
                       "data": {"source": "synthetic", "L": 4096, "sink": 1, "background": 1}},
            "environment": {"git_revision": "0" * 40, "device": "cpu", "device_name": "x86_64"},
            "metrics": {"methods": out}}  # fmt: skip


def test_per_layer_points_are_units_and_pool_to_the_record_mean():
    units = {
        "s2o": [curve(lambda s: math.exp(8 * s)), curve(lambda s: 3 * math.exp(8 * s))],
        "b": [curve(lambda s: 2 * math.exp(8 * s)), curve(lambda s: 6 * math.exp(8 * s))],
    }
    rec = record(units, layers=True)
    got = mp.units_of(rec)
    assert len(got["s2o"]) == 2
    pooled = mp.pool(got["s2o"])
    assert np.allclose([p["mse"] for p in pooled], [p["mse"] for p in rec["metrics"]["methods"]
                                                    ["s2o"]["curve"]])  # fmt: skip
    assert len(mp.units_of(record(units))["s2o"]) == 1  # without per-layer points: one unit


def test_section_writes_the_page_and_names_the_missing_qwen_record(tmp_path):
    units = units_pair(1)
    rel = "experiments/fig4a_mse_vs_sparsity/x/record.json"
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(json.dumps(record(units)))
    manifest = {"experiments": {"fig4a_mse_vs_sparsity": rel}}
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    out = tmp_path / "figures"
    out.mkdir()
    ctx = Ctx(tmp_path, out, manifest, paper_numbers())
    sec = mp.section(ctx)
    page = (out / mp.PAGE).read_text()
    assert "| 0.6 |" in page and "2.00" in page, page
    assert any("fig4a_qwen25_coder_1p5b_32k" in m for m in sec.missing), sec.missing
    assert str(ctx.paper["claims"]["mse_ratio_matched_sparsity"]) in "\n".join(sec.body)
    mp.section(ctx)
    assert (out / mp.PAGE).read_text() == page  # deterministic


def test_the_matched_kind_records_each_layers_point():
    import torch

    from experiments.matched import Curve
    from s2o import METHODS

    g = torch.Generator().manual_seed(0)
    layers = [(i, *(torch.randn(1, 2, 200, 16, generator=g) for _ in range(3))) for i in (0, 5)]
    knobs = {**METHODS["s2o"].defaults, "segment_len": 64, "block_m": 32, "block_n": 32}
    point = Curve("s2o", knobs, layers, {}, progress=False)(0.01)
    assert [x["layer"] for x in point["layers"]] == [0, 5], point
    assert math.isclose(np.mean([x["mse"] for x in point["layers"]]), point["mse"], rel_tol=1e-9)
