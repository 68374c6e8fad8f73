"""analysis/ reads records only: tables and Fig. 4a from tiny dry-run records."""

from __future__ import annotations

import pytest
from harness_util import run_inprocess

from analysis import ablation_tables, plot_mse_vs_sparsity
from analysis.records import paper_numbers


def test_paper_numbers_match_the_published_tables():
    p = paper_numbers()
    rows = {(r[0], r[1]): r[2:] for r in p["hparams"]["rows"]}
    assert rows[(2048, 0.005)] == [0.877, 0.01535, 0.00323]
    assert rows[(4096, 0.005)] == [0.862, 0.01520, 0.00312]
    assert p["component"]["rows"]["with_qperm"] == [0.852, 0.00129, 1.87e-5]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    for name in ("hparams_tau", "hparams_S", "component_ablation", "fig4a_mse_vs_sparsity"):
        rec = run_inprocess([f"experiment={name}", "dry_run=true", "data=synthetic"], out)
        assert rec["status"] == "ok", rec.get("traceback")
    return out


def test_ablation_tables_put_ours_next_to_the_paper(results, tmp_path):
    ablation_tables.main(["--results", str(results), "--out", str(tmp_path / "abl.md")])
    text = (tmp_path / "abl.md").read_text()
    assert "| 256 | 0.005 |" in text and "| 128 | 0.005 |" in text, text
    assert "| with_qperm |" in text and "0.852" in text, text
    assert "no ok record" not in text


def test_fig4a_plot_from_records(results, tmp_path):
    out = tmp_path / "fig4a.png"
    plot_mse_vs_sparsity.main(["--results", str(results), "--out", str(out)])
    assert out.stat().st_size > 5000
