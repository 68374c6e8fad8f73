"""What a reader sees in the figures: legends that hide nothing and name every mark, titles that
say the input, one summary panel per accuracy page, and no tracked figure that nothing makes.
Small hand-made inputs; no record is loaded but the committed figures page."""

from __future__ import annotations

import subprocess

import pandas as pd
import pytest
from harness_util import ROOT


def _boxes(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return r, fig.legends[0].get_window_extent(r) if fig.legends else None


def test_fig1_legend_hides_no_bar_and_no_label():
    from analysis import fig1

    df = pd.DataFrame({
        "label": ["full_flash", "s2o"], "estimate_ms": [0.0, 500.0], "attention_ms": [14e3, 7e3],
        "rest_ms": [4e3, 4e3], "speedup_vs_flash": [1.0, 1.53], "density": [1.0, 0.55],
    })  # fmt: skip
    fig = fig1.figure(df, "title")
    renderer, legend = _boxes(fig)
    ax = fig.axes[0]
    assert legend is not None and not legend.overlaps(ax.get_window_extent(renderer))
    for text in ax.texts:  # the "1.00x, density 1.00" labels
        assert not legend.overlaps(text.get_window_extent(renderer)), text.get_text()


def test_fig4a_legend_names_the_squares_and_the_title_the_input(tmp_path, monkeypatch):
    from analysis import plot_mse_vs_sparsity as fig4a

    seen = {}
    monkeypatch.setattr(fig4a, "save", lambda fig, out: seen.setdefault("fig", fig))
    curve = [{"sparsity": 0.5, "mse": 1e-3}, {"sparsity": 0.8, "mse": 1e-2}]
    rec = {"config": {"data": {"source": "synthetic", "L": 4096}},
           "metrics": {"methods": {"s2o": {"status": "ok", "main_knob": "tau", "curve": curve,
                                           "at_sparsity": curve[1:]}}}}  # fmt: skip
    fig4a.plot(rec, tmp_path / "f.png", "calibrated synthetic input (data=synthetic_calibrated)")
    ax = seen["fig"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["s2o (tau)", "bisected to a target sparsity"], labels
    assert "calibrated synthetic input" in ax.get_title()


def _accuracy_records() -> list[dict]:
    """A full and an s2o record of two tasks at two lengths (20 samples a cell)."""
    from analysis.accuracy_tables import labels

    recs = []
    for i, (method, density, right) in enumerate((("full", 1.0, 18), ("s2o", 0.3, 15))):
        samples = {
            f"{t}-{n}-{k}": {
                "id": f"{t}-{n}-{k}",
                "task": t,
                "length": n,
                "score": float(k < right),
                "density": density,
            }
            for t in ("niah_single_1", "vt")
            for n in (4096, 8192)
            for k in range(20)
        }
        recs.append({"method": method, "id": f"{i:08x}", "_samples": samples,
                     "metrics": {"benchmark": "ruler", "knobs": {}},
                     "config": {"model": {"name": "tiny"}},
                     "environment": {"time": f"2026-01-0{i + 1}"}})  # fmt: skip
    labels(recs)
    return recs


def test_an_accuracy_page_gets_one_summary_panel(tmp_path):
    from analysis import accuracy_summary

    points = accuracy_summary.pooled_points(_accuracy_records())
    got = sorted((n, x["method"], x["acc"], round(x["density"], 9)) for n, x in points)
    assert got == [(4096, "full", 90.0, 1.0), (4096, "s2o", 75.0, 0.3),
                   (8192, "full", 90.0, 1.0), (8192, "s2o", 75.0, 0.3)], got  # fmt: skip
    assert all(x["pool"] == ["niah_single_1", "vt"] for _, x in points)
    out = accuracy_summary.figure(_accuracy_records(), tmp_path / "summary.png")
    assert out is not None and out.stat().st_size > 0


def test_every_tracked_figure_is_one_make_all_writes():
    """A PNG under results/figures/ that the generated page does not name is made by nothing."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "results/figures/*.png"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    page = (ROOT / "results" / "figures" / "README.md").read_text()
    orphans = [p for p in tracked if p.rsplit("/", 1)[-1] not in page]
    assert not orphans, orphans
