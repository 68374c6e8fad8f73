"""What a sweep and a user's runs look like: one table closes a ``-m`` sweep, any records make a
table (``python -m analysis.runs_table``), W&B's console lines wait for ``wandb.verbose=true``.
In-process and fast: hand-written records, no job runs."""

from __future__ import annotations

import json

import pytest
from hydra.core.utils import JobReturn, JobStatus

import run
from analysis import runs_table
from hydra_plugins.s2o_launchers.report import finish

sweep_table = run.sweep_table  # finish asks the task's module for it, as it asks run.py


def task(cfg) -> dict:
    return {}


def _record(path, status: str, tau: float, **metrics) -> str:
    path.mkdir(parents=True)
    rec = {"status": status, "kind": "operator", "method": "s2o",
           "config": {"method": {"tau": tau, "segment_len": 2048}, "results_dir": str(path)},
           "metrics": {**metrics, "latency": {"speedup": 1.5, "timer": "median"}}}  # fmt: skip
    (path / "record.json").write_text(json.dumps(rec))
    return str(path / "record.json")


def test_a_sweep_ends_with_one_table_of_its_points(tmp_path, capsys):
    ok = _record(tmp_path / "a", "ok", 0.001, sparsity=0.25, mse=1e-4)
    err = _record(tmp_path / "b", "error", 0.002)
    overrides = [["tau=0.001", "seed=1"], ["tau=0.002", "seed=1"], ["tau=0.003", "seed=1"],
                 ["tau=abc", "seed=1"]]  # fmt: skip
    rets = [
        JobReturn(status=JobStatus.COMPLETED, _return_value={"status": "ok", "path": ok}),
        JobReturn(status=JobStatus.COMPLETED, _return_value={"status": "error", "path": err}),
        JobReturn(
            status=JobStatus.COMPLETED, _return_value={"status": "ok", "path": ok, "skipped": True}
        ),  # fmt: skip
        JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("killed")),
    ]
    with pytest.raises(Exception) as exc:  # noqa: PT011  (by name: Hydra's plugin scan re-imports it)
        finish(overrides, rets, 0, task)
    assert type(exc.value).__name__ == "SweepFailed"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "sweep: 4 points", out
    header, *rows = out[1:]
    assert header.split() == ["#", "point", "status", "sparsity", "mse", "latency.speedup",
                              "record"], header  # fmt: skip
    assert [r.split()[:3] for r in rows] == [
        ["0", "tau=0.001", "ok"], ["1", "tau=0.002", "error"], ["2", "tau=0.003", "skipped"],
        ["3", "tau=abc", "failed"],
    ]  # fmt: skip
    assert rows[0].split()[3:6] == ["0.25", "0.0001", "1.5"], rows[0]


def test_runs_table_tabulates_any_records(tmp_path, capsys):
    _record(tmp_path / "runs" / "a", "ok", 0.001, sparsity=0.25, mse=1e-4)
    _record(tmp_path / "runs" / "b", "ok", 0.002, sparsity=0.5, mse=2e-4)
    df = runs_table.frame([tmp_path / "runs"])
    assert list(df["method.tau"]) == [0.001, 0.002]  # the config key that differs
    assert "method.segment_len" not in df and "results_dir" not in df
    assert list(df["sparsity"]) == [0.25, 0.5] and list(df["latency.speedup"]) == [1.5, 1.5]
    runs_table.main([str(tmp_path / "runs"), "--csv", str(tmp_path / "t.csv")])
    assert "method.tau" in capsys.readouterr().out
    assert (tmp_path / "t.csv").read_text().startswith("record,kind,method,status,method.tau")


def test_accuracy_cells_pool_into_one_accuracy():
    cells = [{"n": 10, "accuracy": 50.0, "density": 0.2}, {"n": 30, "accuracy": 90.0,
                                                           "density": 0.4}]  # fmt: skip
    got = runs_table.metrics_of({"metrics": {"cells": cells, "n_samples": 40}})
    assert got == {"n_samples": 40, "accuracy": 80.0, "density": pytest.approx(0.35)}


@pytest.mark.parametrize("verbose", [False, True])
def test_wandb_console_lines_wait_for_verbose(verbose, monkeypatch, tmp_path):
    import wandb

    from experiments.common import WandbLogger

    seen = {}
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.update(kw))
    cfg = {"mode": "offline", "project": "s2o", "entity": None, "group": "g", "tags": [],
           "dir": str(tmp_path)}  # fmt: skip
    WandbLogger({**cfg, "verbose": verbose} if verbose else cfg, {}, name="x")
    assert seen["settings"].silent is not verbose


def test_a_users_runs_are_ignored_by_git_and_the_pinned_records_stay_tracked(tmp_path):
    """A new record under results/ (each kind's folder, experiments/records.py PATHS) is ignored
    by git; every record results/manifest.yaml pins is tracked still, at its path."""
    import subprocess

    import yaml
    from harness_util import ROOT, compose

    from experiments.common import resolved_config
    from experiments.records import record_path

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    fresh = []
    for overrides in (["dry_run=true"], ["experiment=hparams_tau", "data=synthetic"],
                      ["kind=e2e", "dry_run=true"],
                      ["kind=accuracy", "benchmark=ruler", "model=smollm2_135m"]):  # fmt: skip
        cfg = compose([*overrides, "results_dir=results", "git_rev=0000000"])
        ctx = run.job_context(cfg)
        fresh.append(str(record_path(resolved_config(run.prepare(cfg, overrides), ctx))))
    ignored = git("check-ignore", "--no-index", *fresh).stdout.split()
    assert ignored == fresh, (fresh, ignored)

    manifest = yaml.safe_load((ROOT / "results" / "manifest.yaml").read_text())
    pinned = [f"results/{p}" for p in manifest["experiments"].values()]
    assert git("ls-files", "--error-unmatch", *pinned).returncode == 0
    assert git("check-ignore", *pinned).stdout == ""  # tracked files are never ignored
