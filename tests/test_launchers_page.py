"""The launcher studies' page (analysis/launchers.py): summary.md is written from summary.json
alone, by the kind of summary (a GPU sweep or --overhead)."""

from __future__ import annotations

import json
from pathlib import Path

from analysis import launchers

ROOT = Path(__file__).resolve().parents[1]
A7 = ROOT / "results/launchers/node_gpus_h100x2_a7eb891"


def test_committed_sweep_pages_are_rebuilt_from_their_summaries():
    for run in ("rep1500ms", "rep4000ms"):
        summary = json.loads((A7 / run / "summary.json").read_text())
        assert launchers.markdown(summary) == (A7 / run / "summary.md").read_text(), run


def test_incomplete_sweep_page_names_no_speedup():
    text = (A7 / "rep4000ms" / "summary.md").read_text()
    assert "- speedup: not measured (a sweep is incomplete: 1gpu: 7 of 8 points ok" in text
    assert "- speedup: 1.38x" in (A7 / "rep1500ms" / "summary.md").read_text()


def test_overhead_summary_gets_its_table(tmp_path):
    run = {"tag": "reuse_true_0", "reuse_workers": True, "loadavg_before": [0.5, 0.4, 0.3],
           "command": [], "returncode": 0, "wall_s": 4.0, "ok": 2, "wall_per_job_s": 2.0,
           "median_elapsed_s": 1.0, "median_job_s": 0.9, "median_overhead_s": 0.1,
           "first_job_of_worker_elapsed_s": 1.2, "later_jobs_elapsed_s": 0.8,
           "worker_processes": 1}  # fmt: skip
    off = run | {"tag": "reuse_false_0", "reuse_workers": False, "wall_per_job_s": 5.0}
    s = {"git_rev": "r", "time": "t", "machine": "m", "gpus": "g", "cuda_visible_devices": "0",
         "command": "c", "points": 2, "sweeps": [run, off]}  # fmt: skip
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(s))
    launchers.main([str(path)])
    text = (tmp_path / "summary.md").read_text()
    assert "| reuse_true_0 | 0 | 2 | 4.0 | 2.000 |" in text, text
    assert "Wall per job, reuse off / on (mean over sweeps): 2.50x" in text


def test_a_cut_accuracy_sweep_gets_no_rate():
    """31e00d2's accuracy sweep: both GPUs complete (a rate), GPU 0 alone cut by the budget (the
    summary of that revision gave it one from its planned samples; the page must not)."""
    folder = ROOT / "results/launchers/node_gpus_accuracy_h100x2_31e00d2"
    text = launchers.markdown(json.loads((folder / "jpg4" / "summary.json").read_text()))
    assert "- all visible GPUs: 250.9 s wall (exit 0); 250 samples, 59.8 a minute" in text, text
    assert "(exit timeout (--budget-s)); cut before its end: no samples-per-minute figure" in text
    assert "542.5" not in text
    for run in ("jpg4", "jpg1"):
        summary = json.loads((folder / run / "summary.json").read_text())
        assert launchers.markdown(summary) == (folder / run / "summary.md").read_text(), run
