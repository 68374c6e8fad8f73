"""tools/node_gpus_sweep.py: the launcher study (every GPU of a node against one) at its CPU size,
its revision stamp, its summary of an incomplete sweep, and its accuracy mode's jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from harness_util import ROOT


@pytest.mark.slow
def test_node_gpus_sweep_tiny_runs_end_to_end(tmp_path):
    """The launcher study at its CPU size (fake GPUs 0,1): both sweeps finish, the summary names
    the revision."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "tools/node_gpus_sweep.py", "--out", str(tmp_path), "--tiny",
           "--git-rev", "testrev"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["git_rev"] == "testrev"
    env_ = summary["environment"]  # written through experiments.records, with provenance
    assert env_["git_revision"] == "testrev" and env_["torch"] and "triton" in env_
    for tag in ("2gpu", "1gpu"):
        sweep = summary["sweeps"][tag]
        assert sweep["returncode"] == 0 and sweep["points"], sweep
        assert all(p["status"] == "ok" for p in sweep["points"]), sweep["points"]


def test_node_gpus_sweep_takes_the_revision_the_records_take(tmp_path):
    """Without --git-rev the launcher study stamps $S2O_GIT_REV, as every record does (on a GPU
    machine that got a copy of the tree, its .git can name an older commit than the code)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "S2O_GIT_REV": "envrev"}
    cmd = [sys.executable, "tools/node_gpus_sweep.py", "--overhead", "1", "--repeats", "1",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["git_rev"] == "envrev" and summary["environment"]["git_revision"] == "envrev"


def test_node_gpus_sweep_reports_no_speedup_over_an_incomplete_sweep():
    """A sweep cut by --budget-s (the 1-GPU one at 7 of 8 points, as on two H100s at a7eb891)
    has no comparable wall time: the summary says why instead of a speedup; the input cache
    reaches every point of a GPU sweep (the warm-up point fills it)."""
    import argparse

    from tools import node_gpus_sweep as ns

    pts = [{"status": "ok"}] * 8
    s = {"sweeps": {"2gpu": {"returncode": 0, "points": pts},
                    "1gpu": {"returncode": "timeout (--budget-s)", "points": pts[:7]}}}  # fmt: skip
    assert ns.incomplete(s, 8) == ["1gpu: 7 of 8 points ok, exit timeout (--budget-s)"]
    s["sweeps"]["1gpu"] = {"returncode": 0, "points": pts}
    assert ns.incomplete(s, 8) == []
    s["sweeps"]["2gpu"]["points"] = pts[:7] + [{"status": "error"}]
    assert ns.incomplete(s, 8) == ["2gpu: 7 of 8 points ok, exit 0"]
    args = argparse.Namespace(tiny=False, taus=["0.005"], L=65536, S=2048, rep_ms=1500,
                              input_cache="/x/input_cache")  # fmt: skip
    assert "input_cache=/x/input_cache" in ns.sweep_args(args)
    args.input_cache = None
    assert not any(o.startswith("input_cache=") for o in ns.sweep_args(args))


def test_node_gpus_sweep_accuracy_mode_composes_one_accuracy_job_per_method():
    """--accuracy (issue 31's second run): every method's job is a valid kind=accuracy config of
    the asked model, task, length and n, with the asked jobs per GPU; the page reports each
    sweep's samples per minute."""
    from argparse import Namespace

    from harness_util import compose

    from analysis.launchers import _samples
    from tools import node_gpus_sweep as ns

    args = Namespace(accuracy=True, tiny=False, model="gemma3_270m", task="niah_single_1",
                     L=8192, n=50, jobs_per_gpu=4, extra=["model.path=/tmp/g"])  # fmt: skip
    over = ns.sweep_args(args)
    assert "hydra.launcher.jobs_per_gpu=4" in over and "model.path=/tmp/g" in over
    methods = next(o for o in over if o.startswith("method=")).split("=")[1].split(",")
    assert methods == ["full", "s2o", "flexprefill", "xattn", "pbs"]
    job = [o for o in over if not o.startswith(("method=", "hydra."))]
    for m in methods:
        cfg = compose([*job, f"method={m}"])
        assert cfg.kind == "accuracy" and cfg.model.name == "gemma3_270m"
        assert list(cfg.benchmark.tasks) == ["niah_single_1"] and cfg.benchmark.n == 50
        assert list(cfg.benchmark.lengths) == [8192] and cfg.model.path == "/tmp/g"
    assert "benchmark.n=1" in ns.accuracy_args(args, 1)  # the warm-up: one sample per method
    rate = "; 250 samples, 83.3 a minute"
    assert _samples({"samples": 250, "samples_per_min": 83.3}, False) == rate
    assert _samples({"wall_s": 3.0}, False) == ""
    cut = "; cut before its end: no samples-per-minute figure"
    assert _samples({"samples": 250, "samples_per_min": 83.3}, True) == cut
    assert _samples({"samples": 3, "samples_per_min": None}, False) == cut


def test_node_gpus_sweep_counts_the_samples_its_jobs_wrote(tmp_path):
    """A sweep's samples are the lines its jobs wrote (a cut sweep wrote fewer than planned)."""
    from tools import node_gpus_sweep as ns

    for job, lines in (("full/a", 3), ("s2o/b", 2)):
        (tmp_path / job).mkdir(parents=True)
        (tmp_path / job / "samples.jsonl").write_text("{}\n" * lines)
    assert ns.samples_written(tmp_path) == 5
    assert ns.samples_written(tmp_path / "none") == 0
