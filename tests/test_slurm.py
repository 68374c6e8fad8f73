"""Sweeps through a real SLURM controller (``hydra/launcher=slurm``), on the CPU.

They need a cluster that ``SLURM_CONF`` names: ``.ci/slurm-up.sh`` starts a single-node one (root,
Debian's slurm-wlm, munge, slurmdbd, mariadb-server) and ``.ci/run`` does so before the tests.
Without one every test here skips, saying why. The partition is ``$S2O_SLURM_PARTITION``
(default ``debug``, the one slurm-up.sh makes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from harness_util import ROOT
from omegaconf import OmegaConf

PARTITION = os.environ.get("S2O_SLURM_PARTITION", "debug")


def _why_no_cluster() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        return (
            "SLURM_CONF is not set: no cluster to submit to (.ci/slurm-up.sh starts one, as "
            "root with slurm-wlm munge slurmdbd mariadb-server; .ci/run does)"
        )
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH (apt-get install slurm-wlm)"
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        return 'hydra-submitit-launcher is not installed (pip install -e ".[slurm]")'
    try:
        state = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return "sinfo timed out: the controller does not answer"
    if state.returncode != 0 or not state.stdout.strip():
        return f"sinfo failed: {state.stderr.strip()[:200]}"
    return None


WHY = _why_no_cluster()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(WHY is not None, reason=str(WHY))]


def sweep(tmp_path, name: str, args: list[str], setup: list[str]) -> subprocess.Popen:
    """Start ``run.py -m`` on SLURM with 1-CPU tasks; records go where ``setup`` exports
    S2O_RESULTS (so a record proves that the setup lines reached the job)."""
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "hydra/launcher=slurm",
        f"hydra.launcher.partition={PARTITION}",
        "hydra.launcher.gpus_per_node=null",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=1",
        "hydra.launcher.timeout_min=10",
        f"hydra.launcher.name={name}",
        "hydra.launcher.setup=[" + ",".join(json.dumps(s) for s in setup) + "]",
        f"hydra.sweep.dir={tmp_path / name}",
        "method=s2o",
        "dry_run=true",
        "timing.enabled=false",
        "wandb.mode=disabled",
        "progress=false",
        *args,
    ]
    env = dict(os.environ, S2O_CI_MARK="from-the-submitting-shell")
    env.pop("S2O_RESULTS", None)
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, timeout: int = 180) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def task_logs(tmp_path, name: str) -> list[str]:
    return [p.read_text() for p in sorted((tmp_path / name / ".submitit").glob("*/*_log.out"))]


def test_every_point_is_an_array_task_and_a_resubmission_skips(tmp_path):
    results = tmp_path / "results"
    setup = ["echo s2o-setup S2O_CI_MARK=$S2O_CI_MARK", f"export S2O_RESULTS={results}"]
    args = ["tau=0.005,0.01,0.02"]
    code, out, err = finish(sweep(tmp_path, "first", args, setup))
    assert code == 0, err[-3000:]
    recs = {p: json.loads(p.read_text()) for p in results.glob("runs/s2o/*/record.json")}
    assert sorted(r["config"]["method"]["tau"] for r in recs.values()) == [0.005, 0.01, 0.02]
    assert all(r["status"] == "ok" for r in recs.values())
    # one array, one task per point: Hydra's job id is SLURM's <array id>_<task id>
    ids = [
        str(OmegaConf.load(tmp_path / "first" / str(n) / ".hydra" / "hydra.yaml").hydra.job.id)
        for n in range(3)
    ]
    assert len({i.split("_")[0] for i in ids}) == 1 and [i.split("_")[1] for i in ids] == [
        "0",
        "1",
        "2",
    ], ids
    logs = task_logs(tmp_path, "first")
    assert len(logs) == 3 and all(
        "s2o-setup S2O_CI_MARK=from-the-submitting-shell" in log for log in logs
    ), logs
    mtimes = {p: p.stat().st_mtime for p in recs}
    code, out, err = finish(sweep(tmp_path, "again", args, setup))
    assert code == 0, err[-3000:]
    assert sum("skip:" in log for log in task_logs(tmp_path, "again")) == 3
    assert {p: p.stat().st_mtime for p in recs} == mtimes


def test_failed_and_killed_points_fail_the_sweep(tmp_path):
    name = f"s2o-ci-{os.getpid()}"
    results = tmp_path / "results"
    # task 2 waits in its setup lines until the test cancels it
    setup = [f"export S2O_RESULTS={results}", 'test "$SLURM_ARRAY_TASK_ID" != 2 || sleep 300']
    proc = sweep(tmp_path, name, ["method.block_m=64,100,128"], setup)
    try:
        task = _wait_running(name, task=2, timeout=90)
        subprocess.run(["scancel", task], check=True)
        code, out, err = finish(proc)
    finally:
        subprocess.run(["scancel", "-n", name], check=False)
        proc.kill()
    assert code == 1, err[-3000:]
    assert "sweep: 2 of 3 points failed" in err, err[-3000:]
    assert "#1 method.block_m=100: ValueError: " in err, err
    assert f"#2 method.block_m=128: RuntimeError: SLURM job {task} ended" in err, err
    (ok,) = [
        json.loads(p.read_text())
        for p in results.glob("runs/s2o/*/record.json")
        if json.loads(p.read_text())["status"] == "ok"
    ]
    assert ok["config"]["method"]["block_m"] == 64


def _wait_running(name: str, task: int, timeout: float) -> str:
    """The id (``<array>_<task>``) of array task ``task`` of job ``name`` once it runs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = subprocess.run(
            ["squeue", "-h", "-n", name, "-o", "%i %t"], capture_output=True, text=True
        ).stdout.split()
        for job, state in zip(out[::2], out[1::2]):
            if job.endswith(f"_{task}") and state == "R":
                return job
        time.sleep(0.5)
    raise AssertionError(f"array task {task} of {name} never ran within {timeout} s")
