"""tools.gpu_session: the background scheduler of a lent GPU machine's plan, on the CPU with
trivial commands and fake GPU counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path

import yaml

from tools import gpu_session as gs

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.gpu_session", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def write_plan(tmp_path: Path, steps: list[dict], vars_: dict | None = None) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"vars": vars_ or {}, "steps": steps}))
    return plan


def serve(tmp_path: Path, steps: list[dict], gpus: int = 2, vars_=None, extra=()) -> Path:
    state = tmp_path / "state"
    r = cli("serve", "--plan", write_plan(tmp_path, steps, vars_), "--state", state,
            "--gpus", gpus, "--root", tmp_path, *extra)  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    assert not (state / "serve.pid").exists()
    return state


def done(state: Path, name: str) -> dict:
    return json.loads((state / "done" / f"{name}.json").read_text())


def span(d: dict) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(d["start"]), datetime.fromisoformat(d["end"])


def test_after_orders_steps(tmp_path):
    steps = [
        {"name": "first", "gpus": [0], "run": "sleep 0.2; echo first >> order"},
        {"name": "second", "gpus": [1], "after": ["first"], "run": "echo second >> order"},
        {"name": "third", "gpus": [0], "after": ["second"], "run": "echo third >> order"},
    ]
    state = serve(tmp_path, steps)
    assert (tmp_path / "order").read_text().split() == ["first", "second", "third"]
    assert span(done(state, "first"))[1] <= span(done(state, "second"))[0]
    assert "ok 3, failed 0, skipped 0" in (state / "finished").read_text()


def test_one_gpu_at_a_time_while_other_gpu_runs_beside(tmp_path):
    steps = [
        {"name": "a", "gpus": [0], "run": "sleep 0.4"},
        {"name": "b", "gpus": [0], "run": "sleep 0.4"},
        {"name": "c", "gpus": [1], "run": "sleep 0.6"},
    ]
    state = serve(tmp_path, steps)
    a, b, c = (span(done(state, n)) for n in "abc")
    assert a[1] <= b[0]  # plan order: a first, b only once GPU 0 is free again
    assert c[0] < a[1] and b[0] < c[1]  # the GPU 1 step ran beside both


def test_gpu_mapping_and_all(tmp_path):
    steps = [
        {"name": "one", "gpus": [1], "run": "echo $CUDA_VISIBLE_DEVICES > one.txt"},
        {"name": "every", "gpus": "all", "run": "echo $CUDA_VISIBLE_DEVICES {gpus} > all.txt"},
    ]
    state = serve(tmp_path, steps, gpus=1)
    assert (tmp_path / "one.txt").read_text().strip() == "0"
    assert (tmp_path / "all.txt").read_text().strip() == "0 1"
    assert done(state, "one")["gpus"] == [0]
    serve(tmp_path, [steps[1] | {"name": "every3"}], gpus=3)
    assert (tmp_path / "all.txt").read_text().strip() == "0,1,2 3"


def test_failure_skips_dependents_only(tmp_path):
    steps = [
        {"name": "bad", "gpus": [0], "run": "exit 3"},
        {"name": "dep", "gpus": [0], "after": ["bad"], "run": "touch dep_ran"},
        {"name": "dep2", "gpus": [1], "after": ["dep"], "run": "touch dep2_ran"},
        {"name": "other", "gpus": [1], "run": "touch other_ran"},
    ]
    state = serve(tmp_path, steps)
    assert done(state, "bad")["rc"] == 3
    assert done(state, "dep")["skipped"] == "bad failed (rc 3)"
    assert done(state, "dep2")["skipped"] == "dep skipped"
    assert done(state, "other")["rc"] == 0 and (tmp_path / "other_ran").exists()
    assert not (tmp_path / "dep_ran").exists() and not (tmp_path / "dep2_ran").exists()
    assert "ok 1, failed 1, skipped 2" in (state / "finished").read_text()
    out = cli("status", "--state", state).stdout
    for name, st in [("bad", "failed rc 3"), ("dep", "skipped"), ("dep2", "skipped"),
                     ("other", "ok")]:  # fmt: skip
        assert any(line.startswith(name + " ") and st in line for line in out.splitlines()), out


def test_resume_reruns_only_the_failed_step(tmp_path):
    steps = [
        {"name": "a", "gpus": [0], "run": "echo a >> runs"},
        {"name": "b", "gpus": [0], "after": ["a"], "run": "echo b >> runs; test -f marker"},
        {"name": "c", "gpus": [0], "after": ["b"], "run": "echo c >> runs"},
    ]
    state = serve(tmp_path, steps)
    assert (tmp_path / "runs").read_text().split() == ["a", "b"]
    assert done(state, "b")["rc"] == 1 and "skipped" in done(state, "c")
    (tmp_path / "marker").touch()
    serve(tmp_path, steps)
    assert (tmp_path / "runs").read_text().split() == ["a", "b", "b", "c"]
    assert [done(state, n)["rc"] for n in "abc"] == [0, 0, 0]


def test_vars_from_steps_and_command_line(tmp_path):
    steps = [
        {"name": "w", "gpus": [0], "run": "echo {x} > before.txt; echo fromstep > {state}/vars/x"},
        {"name": "r", "gpus": [1], "after": ["w"], "run": "echo {x} {y} {z} > after.txt"},
    ]
    vars_ = {"x": "dx", "y": "dy", "z": 7}
    state = serve(tmp_path, steps, vars_=vars_, extra=["--var", "x=cx", "--var", "y=cy"])
    assert (tmp_path / "before.txt").read_text().strip() == "cx"
    assert (tmp_path / "after.txt").read_text().strip() == "fromstep cy 7"
    assert done(state, "r")["vars"] == {"x": "fromstep", "y": "cy", "z": "7"}
    assert done(state, "w")["vars"] == {"x": "cx"}


def test_plan_errors_exit_2(tmp_path):
    plans = {
        "nope": [{"name": "a", "run": "echo {nope}"}],
        "ghost": [{"name": "a", "after": ["ghost"], "run": "echo"}],
        "later": [{"name": "a", "after": ["b"], "run": "echo"}, {"name": "b", "run": "echo"}],
        "gpu_count": [{"name": "a", "run": "echo", "gpu_count": 2}],
        "'a'": [{"name": "a", "run": "echo"}, {"name": "a", "run": "echo"}],
    }
    for word, steps in plans.items():
        r = cli("print", "--plan", write_plan(tmp_path, steps), "--gpus", 1)
        assert r.returncode == 2, (word, r.stdout)
        assert word in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    ok = write_plan(tmp_path, [{"name": "a", "run": "echo {x}"}], {"x": 1})
    r = cli("print", "--plan", ok, "--gpus", 1, "--var", "typo=3")
    assert r.returncode == 2 and "typo" in r.stderr
    r = cli("print", "--plan", ok, "--gpus", 1, "--var", "x=9")
    assert r.returncode == 0 and "echo 9" in r.stdout


def test_timeout_kills_the_process_group(tmp_path):
    steps = [{"name": "slow", "gpus": [0], "timeout_s": 0.5,
              "run": "sleep 30 & echo $! > child.pid; wait"}]  # fmt: skip
    t = time.monotonic()
    state = serve(tmp_path, steps)
    assert time.monotonic() - t < 8
    assert done(state, "slow")["rc"] == 124
    assert not gs._pid_alive(int((tmp_path / "child.pid").read_text()))


def test_start_then_poll_packs_new_files_only(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "old.json").write_text("{}")
    os.utime(results / "old.json", (time.time() - 1000,) * 2)
    run = "sleep 1; mkdir -p results/r1 {state}/sweeps/a/0; echo 1 > results/r1/new.json; "
    run += "echo job > {state}/sweeps/a/0/run.log; echo x > {state}/sweeps/a/0/job.pkl"
    steps = [{"name": "rec", "gpus": [0], "run": run}]
    state, out = tmp_path / "state", tmp_path / "out"
    plan = write_plan(tmp_path, steps)
    t = time.monotonic()
    r = cli("start", "--plan", plan, "--state", state, "--gpus", 1, "--root", tmp_path)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t < 5 and gs.serve_pid(state) is not None  # still running
    again = cli("start", "--plan", plan, "--state", state, "--gpus", 1, "--root", tmp_path)
    assert again.returncode == 2 and "running already" in again.stderr
    r = cli("poll", "--state", state, "--out", out, "--seconds", 15, "--every", 0.3,
            "--root", tmp_path)  # fmt: skip
    assert r.returncode == 0 and "rec" in r.stdout, r.stderr
    with tarfile.open(out / "snapshot.tgz") as tar:
        names = set(tar.getnames())
        status = tar.extractfile("status.txt").read().decode()
    assert "files/results/r1/new.json" in names
    assert not any("old.json" in n for n in names)
    assert {"done/rec.json", "logs/rec.log", "finished", "serve.log"} <= names
    assert "sweeps/a/0/run.log" in names and not any(n.endswith(".pkl") for n in names)
    assert "rec" in status and "ok" in status
    assert gs.serve_pid(state) is None and "ok 1" in (state / "finished").read_text()


def test_poll_returns_by_its_deadline_and_sigterm_stops_serve(tmp_path):
    state, out = tmp_path / "state", tmp_path / "out"
    plan = write_plan(tmp_path, [{"name": "long", "gpus": [0], "run": "sleep 60"}])
    assert cli("start", "--plan", plan, "--state", state, "--gpus", 1).returncode == 0
    t = time.monotonic()
    r = cli("poll", "--state", state, "--out", out, "--seconds", 1.5, "--every", 10)
    assert r.returncode == 0 and time.monotonic() - t < 4.5
    assert (out / "snapshot.tgz").exists() and "running" in r.stdout, r.stdout
    pid = gs.serve_pid(state)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while gs.serve_pid(state) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gs.serve_pid(state) is None
    assert done(state, "long")["rc"] == 143
    assert "interrupted" in (state / "finished").read_text()


def test_poll_on_a_fresh_state_dir_exits_3(tmp_path):
    t = time.monotonic()
    r = cli("poll", "--state", tmp_path / "none", "--out", tmp_path / "out", "--seconds", 60)
    assert r.returncode == 3 and "run start first" in r.stdout
    assert time.monotonic() - t < 5 and not (tmp_path / "out").exists()


def test_the_committed_plan_loads_on_one_and_two_gpus():
    """tools/gpu_session.yaml, the next GPU session's plan: it loads (every var it formats
    exists, every `after` names an earlier step), its timed node sweeps get the machine alone, and
    on one GPU everything maps to GPU 0."""
    path = gs.REPO / "tools" / "gpu_session.yaml"
    two = gs.load_plan(path, 2, {"rev": "abc1234", "tag": "h100x2"})
    steps = {s.name: s for s in two.steps}
    assert steps["node_sweep"].gpus == [0, 1] and steps["node_accuracy"].gpus == [0, 1]
    assert {steps["decode_batch_1"].gpus[0], steps["profile_decode_gemma"].gpus[0]} == {0, 1}
    assert "decode_batch_agreement" in steps["node_sweep"].after
    for s in two.steps:  # every record carries the tree's revision
        cmd = s.run.format(**two.vars, state="/s", gpus=len(s.gpus))
        if "run.py" in cmd:
            assert "S2O_GIT_REV=abc1234" in cmd or "S2O_GIT_REV=28c75f4" in cmd, s.name
        elif "benchmarks." in cmd or "tools." in cmd:
            assert "abc1234" in cmd, s.name
    one = gs.load_plan(path, 1, {"rev": "abc1234"})
    assert {g for s in one.steps for g in s.gpus} == {0}


def test_a_snapshot_over_the_part_size_is_cut_into_parts_that_join(tmp_path, monkeypatch):
    """The device tool returns files of at most 16 MiB: a larger snapshot comes back in parts,
    which join into the same archive; a later small snapshot removes the stale parts."""
    state, out = tmp_path / "state", tmp_path / "out"
    gs.prepare_state(state, gs.load_plan(write_plan(tmp_path, [{"name": "a", "run": "true"}]), 1))
    os.utime(state / "started", (time.time() - 100,) * 2)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "big.bin").write_bytes(os.urandom(50_000))  # incompressible
    monkeypatch.setattr(gs, "PART_BYTES", 20_000)
    gs.write_snapshot(state, out, ["results"], tmp_path)
    parts = sorted(out.glob("snapshot.tgz.part*"))
    assert len(parts) == 3 and not (out / "snapshot.tgz").exists()
    assert all(p.stat().st_size <= 20_000 for p in parts)
    (out / "joined.tgz").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(out / "joined.tgz") as tar:
        assert (
            tar.extractfile("files/results/big.bin").read()
            == (tmp_path / "results" / "big.bin").read_bytes()
        )
    (tmp_path / "results" / "big.bin").unlink()
    gs.write_snapshot(state, out, ["results"], tmp_path)
    assert (out / "snapshot.tgz").exists() and not list(out.glob("snapshot.tgz.part*"))
