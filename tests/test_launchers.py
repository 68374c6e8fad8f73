"""The launchers on the CPU: node_gpus hands each GPU to one job at a time, pinned through
CUDA_VISIBLE_DEVICES, and survives a crashing job; every sweep with failed points names them and
exits 1. No GPU is needed: CUDA_VISIBLE_DEVICES values stand in for GPUs, and the ledger
(``node_gpus.jsonl``) says which value each job was given and saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from harness_util import ROOT, run_cli

from hydra_plugins.s2o_launchers.node_gpus import pick_gpus

APP = """
import os, signal, time
import hydra

@hydra.main(version_base="1.3", config_path=".", config_name="app")
def main(cfg):
    time.sleep(cfg.sleep)
    if cfg.n == cfg.crash_at:
        os.kill(os.getpid(), signal.SIGKILL)  # a hard crash: no exception, no result
    return {"status": "ok"}

if __name__ == "__main__":
    main()
"""

APP_YAML = """
defaults:
  - _self_
  - override hydra/launcher: node_gpus
hydra:
  searchpath: [file://{conf}]
  sweep: {{dir: {sweep}}}
n: 0
sleep: 1.0
crash_at: -1
"""


def test_pick_gpus_follows_cuda_visible_devices():
    def no_count():
        raise AssertionError("device count asked although CUDA_VISIBLE_DEVICES is set")

    assert pick_gpus(None, {"CUDA_VISIBLE_DEVICES": "2,3"}, no_count) == ["2", "3"]
    assert pick_gpus([1], {"CUDA_VISIBLE_DEVICES": "2, 3"}, no_count) == ["3"]
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aa11,GPU-bb22"}
    assert pick_gpus(None, uuids, no_count) == ["GPU-aa11", "GPU-bb22"]
    assert pick_gpus(None, {"CUDA_VISIBLE_DEVICES": "0,-1,2"}, no_count) == ["0"]
    assert pick_gpus(None, {}, lambda: 4) == ["0", "1", "2", "3"]
    assert pick_gpus("0,2", {}, lambda: 4) == ["0", "2"]
    with pytest.raises(ValueError, match="no GPU is visible"):
        pick_gpus(None, {}, lambda: 0)
    with pytest.raises(ValueError, match="no GPU is visible"):
        pick_gpus(None, {"CUDA_VISIBLE_DEVICES": ""}, no_count)
    with pytest.raises(ValueError, match="distinct positions"):
        pick_gpus([0, 2], {"CUDA_VISIBLE_DEVICES": "5,6"}, no_count)
    with pytest.raises(ValueError, match="distinct positions"):
        pick_gpus([1, 1], {}, lambda: 2)


def _ledger(sweep) -> list[dict]:
    lines = (sweep / "node_gpus.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["num"])


def _overlap(a: dict, b: dict) -> bool:
    t = lambda r, k: datetime.fromisoformat(r[k]).timestamp()
    return t(a, "start") < t(b, "end") and t(b, "start") < t(a, "end")


def test_node_gpus_one_job_per_gpu_and_a_crash_stays_alone(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    sweep = tmp_path / "sweep"
    (tmp_path / "app.yaml").write_text(APP_YAML.format(conf=ROOT / "conf", sweep=sweep))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "app.py", "-m", "n=0,1,2,3,4", "crash_at=2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "sweep: 1 of 5 points failed" in proc.stderr, proc.stderr[-3000:]
    assert "#2 n=2: RuntimeError: process killed by SIGKILL" in proc.stderr, proc.stderr[-3000:]
    jobs = _ledger(sweep)
    assert [j["status"] for j in jobs] == ["ok", "ok", "failed", "ok", "ok"], jobs
    assert {j["gpu"] for j in jobs} == {"3", "5"}, jobs
    for j in jobs:  # the job's process saw its GPU alone (the crashed one reported nothing)
        assert j["gpu_seen_by_job"] == (None if j["num"] == 2 else j["gpu"]), j
    pairs = [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1 :] if _overlap(a, b)]
    assert pairs, "the two GPUs never ran jobs at the same time"
    assert all(a["gpu"] != b["gpu"] for a, b in pairs), f"two jobs at once on one GPU: {pairs}"


def test_run_py_sweep_on_node_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    args = [
        "-m",
        "hydra/launcher=node_gpus",
        "method=s2o",
        "tau=0.005,0.02",
        "dry_run=true",
        "timing.enabled=false",
    ]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _ledger(tmp_path / "hydra_multi")
    assert [j["status"] for j in jobs] == ["ok", "ok"] and {j["gpu"] for j in jobs} == {"0", "1"}
    recs = [json.loads(p.read_text()) for p in tmp_path.glob("runs/s2o/*/record.json")]
    assert sorted(r["config"]["method"]["tau"] for r in recs) == [0.005, 0.02]


def test_in_process_sweep_with_failed_points_exits_1(tmp_path):
    proc = run_cli(
        [
            "experiment=hparams_tau",
            "data=synthetic",
            "dry_run=true",
            "method.block_m=100",
            "timing.enabled=false",
        ],
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "failed points (2 of 2): tau=0.005; tau=0.02" in proc.stdout, proc.stdout[-3000:]
