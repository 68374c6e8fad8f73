"""The launchers on the CPU: node_gpus hands each GPU to one job at a time, pinned through
CUDA_VISIBLE_DEVICES, and survives a crashing job; every sweep with failed points names them and
exits 1. No GPU is needed: CUDA_VISIBLE_DEVICES values stand in for GPUs, and the ledger
(``node_gpus.jsonl``) says which value each job was given and saw."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from harness_util import ROOT, run_cli

from hydra_plugins.s2o_launchers.node_gpus import NodeGpusLauncher, cpu_sets, pick_gpus

APP = """
import json, logging, os, signal, subprocess, time
from pathlib import Path
import hydra
from hydra.core.hydra_config import HydraConfig

@hydra.main(version_base="1.3", config_path=".", config_name="app")
def main(cfg):
    hc = HydraConfig.get()
    root = logging.getLogger()
    seen = {
        "n": cfg.n,
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cwd": os.getcwd(),
        "job_num": hc.job.num,
        "output_dir": hc.runtime.output_dir,
        "leaked_env": os.environ.get("S2O_TEST_LEAK"),
        "cpus": sorted(os.sched_getaffinity(0)),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "app_handlers": len(logging.getLogger("app").handlers),
        "root_files": [h.baseFilename for h in root.handlers if hasattr(h, "baseFilename")],
    }
    if cfg.spawn:  # a child of the job: stopping the sweep must stop it too
        seen["child"] = subprocess.Popen(["sleep", "300"]).pid
    Path(cfg.seen_dir, f"{cfg.n}.json").write_text(json.dumps(seen))
    # what a careless job leaves behind for the next job of its worker
    os.environ["S2O_TEST_LEAK"] = str(cfg.n)
    os.chdir("/")
    logging.getLogger("app").addHandler(logging.FileHandler(Path(cfg.seen_dir, "leak.log")))
    time.sleep(cfg.sleep)
    if cfg.n == cfg.crash_at:
        os.kill(os.getpid(), signal.SIGKILL)  # a hard crash: no exception, no result
    if cfg.n == cfg.exit_at:
        os._exit(3)
    if cfg.n == cfg.raise_at:
        raise ValueError(f"job {cfg.n} raised")
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
  job: {{chdir: false}}
n: 0
sleep: 0.5
crash_at: -1
exit_at: -1
raise_at: -1
spawn: false
seen_dir: {seen}
"""


def _app(tmp_path) -> dict:
    """Write the test app; the paths of its sweep folder and of the files its jobs write."""
    (tmp_path / "app.py").write_text(APP)
    sweep, seen = tmp_path / "sweep", tmp_path / "seen"
    seen.mkdir()
    yaml = APP_YAML.format(conf=ROOT / "conf", sweep=sweep, seen=seen)
    (tmp_path / "app.yaml").write_text(yaml)
    return {"sweep": sweep, "seen": seen}


def _sweep(tmp_path, gpus: str, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "app.py", "-m", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _seen(seen_dir) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in seen_dir.glob("*.json")}


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


def test_reuse_workers_must_be_a_bool():
    assert NodeGpusLauncher(reuse_workers=False).reuse_workers is False
    with pytest.raises(ValueError, match="reuse_workers='no' must be true or false"):
        NodeGpusLauncher(reuse_workers="no")


def _ledger(sweep) -> list[dict]:
    lines = (sweep / "node_gpus.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["num"])


def _overlap(a: dict, b: dict) -> bool:
    t = lambda r, k: datetime.fromisoformat(r[k]).timestamp()
    return t(a, "start") < t(b, "end") and t(b, "start") < t(a, "end")


def _next_on_gpu(jobs: list[dict], job: dict) -> dict | None:
    """The job the launcher handed to the GPU of ``job`` after it (ledger lines, by start)."""
    later = [j for j in jobs if j["gpu"] == job["gpu"] and j["start"] > job["start"]]
    return min(later, key=lambda j: j["start"]) if later else None


def test_node_gpus_reuses_a_worker_per_gpu_and_survives_failing_jobs(tmp_path):
    paths = _app(tmp_path)
    args = ["n=0,1,2,3,4,5,6,7", "raise_at=1", "crash_at=2", "exit_at=4"]
    proc = _sweep(tmp_path, "3,5", args)
    err = proc.stderr[-3000:]
    assert proc.returncode == 1, err
    assert "sweep: 3 of 8 points failed" in err, err
    assert "#1 n=1: ValueError: job 1 raised" in err, err
    assert "#2 n=2: RuntimeError: process killed by SIGKILL before reporting" in err, err
    assert "#4 n=4: RuntimeError: process exited (3) before reporting" in err, err
    jobs, seen = _ledger(paths["sweep"]), _seen(paths["seen"])
    failed = {1, 2, 4}
    assert [j["status"] for j in jobs] == ["failed" if j["num"] in failed else "ok" for j in jobs]
    assert {j["gpu"] for j in jobs} == {"3", "5"}, jobs
    for j in jobs:  # each job saw its GPU alone, in the worker the ledger names
        assert seen[j["num"]]["cuda_visible_devices"] == j["gpu"], (j, seen[j["num"]])
        assert seen[j["num"]]["pid"] == j["pid"], (j, seen[j["num"]])
        assert j["gpu_seen_by_job"] == (None if j["num"] in (2, 4) else j["gpu"]), j
    pairs = [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1 :] if _overlap(a, b)]
    assert pairs, "the two GPUs never ran jobs at the same time"
    assert all(a["gpu"] != b["gpu"] for a, b in pairs), f"two jobs at once on one GPU: {pairs}"
    assert max(j["worker_job"] for j in jobs) >= 2, f"no worker served several jobs: {jobs}"
    by_num = {j["num"]: j for j in jobs}
    after_raise = _next_on_gpu(jobs, by_num[1])
    assert after_raise is not None and after_raise["pid"] == by_num[1]["pid"], jobs
    for crashed in (2, 4):  # the GPU's next job ran in a new worker
        after = _next_on_gpu(jobs, by_num[crashed])
        assert after is None or after["pid"] != by_num[crashed]["pid"], jobs
        assert after is None or after["worker_job"] == 1, jobs
    assert any(_next_on_gpu(jobs, by_num[c]) for c in (2, 4)), "no job ran after a crash"
    for n, s in seen.items():  # Hydra's state is the job's own; nothing of the previous job
        assert s["job_num"] == n and s["output_dir"] == str(paths["sweep"] / str(n)), s
        assert s["cwd"] == str(tmp_path), s
        assert s["leaked_env"] is None and s["app_handlers"] == 0, s
        assert s["root_files"] == [str(paths["sweep"] / str(n) / "app.log")], s
    for j in jobs:  # Hydra's output_subdir of each job: its own overrides and job number
        hydra_dir = paths["sweep"] / str(j["num"]) / ".hydra"
        assert f"- n={j['num']}\n" in (hydra_dir / "overrides.yaml").read_text(), j
        assert f"    num: {j['num']}\n" in (hydra_dir / "hydra.yaml").read_text(), j
    for j in jobs:  # each job's output went to its own log
        log_text = Path(j["log"]).read_text()
        others = [f"job {m} raised" for m in range(8) if m != j["num"]]
        assert not any(o in log_text for o in others), (j["num"], log_text)
    assert "job 1 raised" in Path(by_num[1]["log"]).read_text()


@pytest.mark.parametrize("reuse", [True, False])
def test_node_gpus_reuse_workers_switch_and_chdir(tmp_path, reuse):
    paths = _app(tmp_path)
    args = ["n=0,1,2", "sleep=0", "hydra.job.chdir=true", f"hydra.launcher.reuse_workers={reuse}"]
    proc = _sweep(tmp_path, "7", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs, seen = _ledger(paths["sweep"]), _seen(paths["seen"])
    assert [j["status"] for j in jobs] == ["ok"] * 3 and {j["gpu"] for j in jobs} == {"7"}, jobs
    pids = [j["pid"] for j in jobs]
    if reuse:
        assert len(set(pids)) == 1 and [j["worker_job"] for j in jobs] == [1, 2, 3], jobs
    else:
        assert len(set(pids)) == 3 and [j["worker_job"] for j in jobs] == [1, 1, 1], jobs
    for n, s in seen.items():  # chdir=true: each job starts in its own folder, whatever came before
        assert s["cwd"] == s["output_dir"] == str(paths["sweep"] / str(n)), s
        assert s["leaked_env"] is None and s["app_handlers"] == 0, s


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped (it holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_node_gpus_stopping_the_sweep_stops_workers_and_their_children(tmp_path, sig):
    paths = _app(tmp_path)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "app.py", "-m", "n=0,1,2", "sleep=300", "spawn=true"]
    # Ctrl-C reaches a sweep run in the foreground. A shell's background job (``cmd &``, ``nohup``)
    # starts with SIGINT ignored, which Python keeps; pytest run that way passes it on to the
    # sweep, which then rightly ignores the signal: so the sweep starts as a foreground one would
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 60
        while len(_seen(paths["seen"])) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        seen = _seen(paths["seen"])
        assert len(seen) == 2, proc.stdout.read() if proc.poll() is not None else seen
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0, out[-3000:]
    pids = [p for s in seen.values() for p in (s["pid"], s["child"])]
    deadline = time.time() + 5
    while not all(_gone(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), f"still running: {[p for p in pids if not _gone(p)]}"


def test_run_py_sweep_on_node_gpus_reuses_workers_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    args = [
        "-m",
        "hydra/launcher=node_gpus",
        "method=s2o",
        "tau=0.005,0.01,0.02",
        "dry_run=true",
        "timing.enabled=false",
    ]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _ledger(tmp_path / "hydra_multi")
    assert [j["status"] for j in jobs] == ["ok"] * 3 and {j["gpu"] for j in jobs} == {"0", "1"}
    assert len({j["pid"] for j in jobs}) == 2, f"3 jobs on 2 GPUs need 2 workers: {jobs}"
    records = sorted(tmp_path.glob("runs/s2o/*/record.json"))
    taus = sorted(json.loads(p.read_text())["config"]["method"]["tau"] for p in records)
    assert taus == [0.005, 0.01, 0.02]
    proc = run_cli(args, tmp_path)  # the same sweep again: every point is done
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / "hydra_multi" / "node_gpus.jsonl").read_text().splitlines()
    again = [json.loads(line) for line in lines[3:]]
    assert [j["status"] for j in again] == ["ok"] * 3, again
    for j in again:
        assert "skip: " in Path(j["log"]).read_text(), Path(j["log"]).read_text()
    assert sorted(tmp_path.glob("runs/s2o/*/record.json")) == records


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


def test_jobs_per_gpu_must_be_a_positive_int():
    assert NodeGpusLauncher(jobs_per_gpu=3).jobs_per_gpu == 3
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match=f"jobs_per_gpu={bad!r} must be an integer >= 1"):
            NodeGpusLauncher(jobs_per_gpu=bad)


def test_node_gpus_jobs_per_gpu_runs_that_many_at_once_on_each_gpu(tmp_path):
    """jobs_per_gpu=2 on two GPUs: two workers per GPU, each pinned to it; jobs overlap on one GPU
    (never more than two at once), and the ledger says how many shared it."""
    paths = _app(tmp_path)
    args = ["n=0,1,2,3,4,5,6,7", "sleep=1.0", "hydra.launcher.jobs_per_gpu=2"]
    proc = _sweep(tmp_path, "3,5", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 at a time (sharing it" in proc.stdout + proc.stderr, proc.stdout[-2000:]
    jobs, seen = _ledger(paths["sweep"]), _seen(paths["seen"])
    assert [j["status"] for j in jobs] == ["ok"] * 8 and {j["jobs_per_gpu"] for j in jobs} == {2}
    for gpu in ("3", "5"):
        mine = [j for j in jobs if j["gpu"] == gpu]
        assert len({j["pid"] for j in mine}) == 2, mine  # two reused workers on this GPU
        assert all(seen[j["num"]]["cuda_visible_devices"] == gpu for j in mine)
        assert any(_overlap(a, b) for i, a in enumerate(mine) for b in mine[i + 1 :]), mine
        for a in mine:  # at most two at once: no job overlaps two others that overlap each other
            over = [b for b in mine if b is not a and _overlap(a, b)]
            assert not any(_overlap(b, c) for i, b in enumerate(over) for c in over[i + 1 :]), mine


def test_a_timed_run_on_a_shared_gpu_warns(monkeypatch, capsys):
    """A node_gpus worker with jobs_per_gpu > 1 warns that a timed kind's times are shared; an
    accuracy run (whose point is not its times) and an unshared GPU do not."""
    import run

    timed = {"kind": "operator", "timing": {"enabled": True}}
    monkeypatch.setenv("S2O_JOBS_PER_GPU", "4")
    run.warn_shared_gpu(timed)
    assert "4 jobs share this GPU" in capsys.readouterr().err
    run.warn_shared_gpu({"kind": "accuracy", "timing": {"enabled": True}})
    run.warn_shared_gpu({"kind": "operator", "timing": {"enabled": False}})
    monkeypatch.setenv("S2O_JOBS_PER_GPU", "1")
    run.warn_shared_gpu(timed)
    assert capsys.readouterr().err == ""


def test_cpu_sets_split_the_launchers_cpus_into_disjoint_blocks():
    assert cpu_sets(None, 4, range(8)) is None
    assert cpu_sets("auto", 2, [5, 4, 7, 6]) == [[4, 5], [6, 7]]
    assert cpu_sets("auto", 3, range(8)) == [[0, 1], [2, 3], [4, 5]]  # 6 and 7 stay unused
    assert cpu_sets("auto", 3, [0, 1]) == [[0], [1], [0]]  # fewer CPUs than workers: shared
    assert cpu_sets(3, 2, range(8)) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="cpus_per_worker=3 for 3 workers needs 9 CPUs"):
        cpu_sets(3, 3, range(8))
    for bad in (0, -2, True, "all", 1.5):
        with pytest.raises(ValueError, match=f"cpus_per_worker={bad!r} must be auto, null"):
            NodeGpusLauncher(cpus_per_worker=bad)


def test_cpu_pinning_is_refused_where_the_os_has_no_affinity(monkeypatch):
    from hydra_plugins.s2o_launchers import node_gpus

    monkeypatch.delattr(node_gpus.os, "sched_getaffinity")
    assert node_gpus._own_cpus(None) == []
    with pytest.raises(ValueError, match="cpus_per_worker='auto' pins workers to CPUs"):
        node_gpus._own_cpus("auto")


def _cpu_ranges(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus += range(int(a), int(b or a) + 1)
    return cpus


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to give each a worker")
def test_node_gpus_pins_each_worker_to_its_own_cpus(tmp_path):
    """Two fake GPUs, one CPU per worker: every job runs on its worker's CPU alone, with OpenMP
    sized to it, the ledger names it, and the two GPUs' CPUs differ; null pins nothing."""
    paths = _app(tmp_path)
    args = ["n=0,1,2,3", "sleep=0.2", "hydra.launcher.cpus_per_worker=1"]
    proc = _sweep(tmp_path, "0,1", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs, seen = _ledger(paths["sweep"]), _seen(paths["seen"])
    for j in jobs:
        assert seen[j["num"]]["cpus"] == _cpu_ranges(j["cpus"]) and len(seen[j["num"]]["cpus"]) == 1
        assert seen[j["num"]]["omp_threads"] == (os.environ.get("OMP_NUM_THREADS") or "1")
    by_gpu = {j["gpu"]: j["cpus"] for j in jobs}
    assert len(by_gpu) == 2 and len(set(by_gpu.values())) == 2, jobs

    (tmp_path / "free").mkdir()
    paths = _app(tmp_path / "free")
    proc = _sweep(tmp_path / "free", "0,1", ["n=0,1", "hydra.launcher.cpus_per_worker=null"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {j["cpus"] for j in _ledger(paths["sweep"])} == {None}
    assert all(s["cpus"] == sorted(os.sched_getaffinity(0)) for s in _seen(paths["seen"]).values())


def test_node_gpus_without_a_gpu_refuses_in_one_line(tmp_path, monkeypatch):
    """The README's every-GPU command on a CPU machine: one error line naming the way out, exit
    code 2, no traceback (Hydra printed its whole stack before)."""
    from harness_util import run_cli

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = run_cli(["-m", "hydra/launcher=node_gpus", "method=s2o", "tau=0.001,0.005"], tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert "no GPU is visible" in line and "hydra/launcher=local" in line
