"""The harness's safeguards (issue 16): no NaN result recorded ok, no stale result reused
silently, errors early and in one line. Each test uses the command line or input the issue
reports."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from harness_util import ROOT, compose, run_cli, run_inprocess, scaled

import run
from experiments import records as common
from experiments.common import ConfigError, resolved_config
from experiments.records import execute, point_record_path

TINY = ["dry_run=true", "timing.enabled=false"]


def resolved(overrides: list[str], results) -> dict:
    cfg = compose(overrides + [f"results_dir={results}", "wandb.mode=disabled", "progress=false"])
    ctx = run.job_context(cfg)
    return resolved_config(run.prepare(cfg, ctx.overrides), ctx)


# --- silent wrong numbers -----------------------------------------------------------------------


def test_a_record_with_a_non_finite_metric_is_not_ok(tmp_path):
    res = resolved(TINY, tmp_path)
    path = point_record_path(res)
    rec, _ = execute(res, path, lambda: {"mse": float("nan"), "per_layer": [{"mae": math.inf}]})
    assert rec["status"] == "error"
    assert "mse=nan" in rec["error"] and "per_layer.0.mae=inf" in rec["error"], rec["error"]
    assert json.loads(path.read_text())["status"] == "error"


# --- stale or overwritten results ---------------------------------------------------------------


def test_device_index_is_not_identity_but_the_gpu_model_is(tmp_path, monkeypatch):
    names = {"cuda": "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names["cuda"])
    res = resolved(TINY, tmp_path)
    ids = {}
    for dev in ("cuda", "cuda:0", "cuda:3"):
        ids[dev] = point_record_path({**res, "device": dev})
    assert len(set(ids.values())) == 1, ids  # a per-GPU launcher resume with other GPU counts
    names["cuda"] = "NVIDIA H100 80GB HBM3"
    assert point_record_path({**res, "device": "cuda:0"}) != ids["cuda"]
    assert point_record_path(res) != ids["cuda"]  # cpu


def test_other_code_reruns_by_default_and_reuse_stale_reuses_it_marked(tmp_path, monkeypatch):
    first = run_inprocess(TINY, tmp_path)
    assert first["status"] == "ok" and not first.get("skipped")
    assert run_inprocess(TINY, tmp_path).get("skipped")  # same code: skipped
    monkeypatch.setattr(common, "code_revision", lambda explicit: "another-commit")
    again = run_inprocess(TINY, tmp_path)
    assert not again.get("skipped"), "a record of other code was reused silently"
    assert again["identity"]["code"] == "another-commit"
    monkeypatch.setattr(common, "code_revision", lambda explicit: "a-third-commit")
    reused = run_inprocess(TINY + ["reuse_stale=true"], tmp_path)
    assert reused.get("skipped") and reused["stale"]["code"] == "another-commit", reused


def test_a_sweep_marks_stale_points(tmp_path, monkeypatch):
    base = ["experiment=hparams_tau", "dry_run=true", "timing.enabled=false"]
    assert run_inprocess(base, tmp_path)["status"] == "ok"
    monkeypatch.setattr(common, "code_revision", lambda explicit: "another-commit")
    sweep = run_inprocess(base + ["reuse_stale=true"], tmp_path)
    points = sweep["metrics"]["points"]
    assert all(p["skipped"] and p["stale"]["code"] for p in points), points


def test_a_changed_data_file_at_the_same_path_reruns(tmp_path):
    from safetensors.torch import save_file

    from eval.synthetic import SyntheticSpec, synthetic_qkv

    f = tmp_path / "qkv.safetensors"
    for seed, want_skip in ((0, False), (0, True), (1, False)):
        spec = SyntheticSpec(L=128, heads_q=2, heads_kv=1, head_dim=16, seed=seed)
        q, k, v = synthetic_qkv(spec)
        if not want_skip:
            save_file({"q.0": q, "k.0": k, "v.0": v}, str(f))
        rec = run_inprocess(
            ["data=file", f"data.path={f}", "S=64", "method.block_m=32", "method.block_n=32",
             "timing.enabled=false"], tmp_path / "results",
        )  # fmt: skip
        assert rec["status"] == "ok", rec.get("error")
        assert bool(rec.get("skipped")) == want_skip, (seed, want_skip)


def test_a_committed_record_is_never_replaced():
    from experiments.provenance import is_tracked

    committed = sorted((ROOT / "results" / "runs").glob("*/*/record.json"))[0]
    if not is_tracked(committed):
        pytest.skip("not a git checkout: nothing is tracked")
    before = committed.read_bytes()
    rec = json.loads(before)
    res = {**rec["config"], "skip_done": False, "results_dir": str(ROOT / "results")}
    with pytest.raises(ConfigError, match="committed record"):
        execute(res, committed, lambda: {"mse": 0.0})
    assert committed.read_bytes() == before


# --- errors that came too late or never ---------------------------------------------------------


def test_unwritable_results_dir_fails_before_computing(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"results_dir=.*a_file/results is not writable"):
        run.run_job(compose(TINY + [f"results_dir={blocker}/results", "wandb.mode=disabled"]))


def test_paper_scale_point_on_cpu_is_refused_naming_size_and_remedy(tmp_path):
    rec = run_inprocess(["device=cpu", "data.L=131072", "timing.enabled=false"], tmp_path)
    assert rec["status"] == "error"
    assert "GiB" in rec["error"] and "L=131072" in rec["error"], rec["error"]
    assert "device=cuda" in rec["error"] and "dry_run=true" in rec["error"], rec["error"]
    assert rec["elapsed_s"] < 5, "refused up front, before building the inputs"


def _save(tmp_path, **tensors):
    from safetensors.torch import save_file

    path = tmp_path / "qkv.safetensors"
    save_file(tensors, str(path))
    return path


def test_truncated_safetensors_names_the_file(tmp_path):
    from eval.data import load_layers

    q = torch.randn(1, 2, 64, 16)
    path = _save(tmp_path, **{"q.0": q, "k.0": q[:, :1].clone(), "v.0": q[:, :1].clone()})
    path.write_bytes(path.read_bytes()[:-100])
    data = {"source": "file", "path": str(path), "L": None, "layers": None}
    with pytest.raises(ValueError, match=rf"{path}: cannot read this safetensors file"):
        load_layers(data, None, torch.device("cpu"), torch.float32)
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=rf"{path}: cannot read"):
        load_layers(data, None, torch.device("cpu"), torch.float32)


def test_int32_data_file_is_refused(tmp_path):
    q = torch.randint(0, 9, (1, 2, 64, 16), dtype=torch.int32)
    path = _save(tmp_path, **{"q.0": q, "k.0": q[:, :1].clone(), "v.0": q[:, :1].clone()})
    rec = run_inprocess(["data=file", f"data.path={path}", "S=32", "method.block_m=16",
                         "method.block_n=16", "timing.enabled=false"], tmp_path)  # fmt: skip
    assert rec["status"] == "error"
    assert "q.0 has dtype torch.int32" in rec["error"] and str(path) in rec["error"], rec["error"]


@pytest.mark.parametrize(
    "experiment",
    sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")
           if not p.stem.startswith("accuracy_")),  # those need a model's tokenizer
)  # fmt: skip
def test_every_experiment_dry_runs_by_name_without_weights(experiment, tmp_path):
    """Exactly `python run.py experiment=<name> dry_run=true`: no data=synthetic given."""
    rec = run_inprocess([f"experiment={experiment}", "dry_run=true"], tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["config"]["data"]["source"] == "synthetic" and rec["config"]["data"]["L"] <= 512
    for p in rec["metrics"].get("points", []):
        assert p["status"] == "ok", p


@pytest.mark.parametrize("study, scale", scaled())
def test_every_scaled_study_dry_runs_by_name_without_weights(study, scale, tmp_path):
    """Exactly `python run.py experiment=<study> scale=<preset> dry_run=true`."""
    rec = run_inprocess([f"experiment={study}", f"scale={scale}", "dry_run=true"], tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["config"]["data"]["source"] == "synthetic" and rec["config"]["data"]["L"] <= 512
    for p in rec["metrics"].get("points", []):
        assert p["status"] == "ok", p


def test_plus_key_warns_that_no_code_reads_it(capsys):
    run.warn_unread_keys(["+taux=1", "+data.sinkk=2", "tau=0.1", "+hydra.job.env_set.X=1"])
    err = capsys.readouterr().err
    assert "+taux=1" in err and "+data.sinkk=2" in err and "no code reads" in err, err
    assert "tau=0.1" not in err and "hydra" not in err
    run.warn_unread_keys(["+model.dequant_cache=false", "+model.dequant_cach=false"])
    err = capsys.readouterr().err
    assert "+model.dequant_cach=false" in err and "+model.dequant_cache=false" not in err, err


@pytest.mark.parametrize(
    "overrides, want",
    [(["S=100"], {"S": 100, "method.segment_len": 100, "data.L": 512}),
     (["data.L=300"], {"S": 256, "data.L": 300}),
     (["experiment=hparams_tau", "data.L=384"], {"data.L": 384, "data.source": "synthetic"})],
)  # fmt: skip
def test_dry_run_keeps_command_line_values(overrides, want, tmp_path):
    """Was: `S=100 dry_run=true` recorded S=256 (and then skipped against an earlier run)."""
    from omegaconf import OmegaConf

    res = OmegaConf.create(resolved(overrides + ["dry_run=true"], tmp_path))
    got = {k: OmegaConf.select(res, k) for k in want}
    assert got == want


def test_method_knobs_are_checked_before_the_model_capture(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("a few words")
    args = ["data=model", "model=llama31_8b", f"data.text={text}", "model.path=/nonexistent/w"]
    rec = run_inprocess(args + ["method.block_m=100"], tmp_path)
    assert rec["status"] == "error"
    assert "block_m=100" in rec["error"], rec["error"]


def test_seed_abc_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"seed='abc' must be an int"):
        run_inprocess(["seed=abc", "dry_run=true"], tmp_path)
    with pytest.raises(ConfigError, match=r"data.L='abc' must be an int"):
        run_inprocess(["data.L=abc", "dry_run=true"], tmp_path)
    with pytest.raises(ConfigError, match=r"device='cuda:x' is not one of"):
        run_inprocess(["device=cuda:x", "dry_run=true"], tmp_path)
    with pytest.raises(ConfigError, match=r"data.path=/nonexistent.st: no such file"):
        run_inprocess(["data=file", "data.path=/nonexistent.st"], tmp_path)


@pytest.mark.parametrize(
    "args, needle",
    [(["seed=abc"], "seed='abc'"), (["device=tpu"], "device='tpu'"),
     (["data=file"], "data.path")],
)  # fmt: skip
def test_bad_command_lines_end_in_one_line_naming_the_key(args, needle, tmp_path):
    proc = run_cli(args + ["dry_run=true"], tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and needle in lines[-1], proc.stderr[-2000:]


def test_gpu_processes_counts_the_processes_on_this_gpu(monkeypatch):
    """The environment block says how many processes shared the GPU (matched by UUID): 2 here,
    of 3 listed on two GPUs; None when nvidia-smi lists none (a container) or is missing."""
    import types

    import torch

    from experiments import provenance

    me = "5f2c0a3e-1111-2222-3333-444455556666"
    listing = (f"GPU-{me}, 101\nGPU-aaaaaaaa-0000-0000-0000-000000000000, 102\n"
               f"GPU-{me}, 103\n")  # fmt: skip
    monkeypatch.setattr(provenance.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    props = types.SimpleNamespace(uuid=me)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    ran = types.SimpleNamespace(returncode=0, stdout=listing)
    monkeypatch.setattr(provenance.subprocess, "run", lambda *a, **k: ran)
    assert provenance.gpu_processes(0) == 2
    ran.stdout = ""
    assert provenance.gpu_processes(0) is None
    monkeypatch.setattr(provenance.shutil, "which", lambda name: None)
    assert provenance.gpu_processes(0) is None


def test_gpu_jobs_sees_harness_processes_that_nvidia_smi_does_not(tmp_path):
    """In a container nvidia-smi lists no process; a job still counts the live processes of this
    harness that registered on its GPU (one file per GPU uuid and pid): another live one makes
    2, its file goes once it has exited, and another GPU's files do not count."""
    import subprocess
    import sys

    from analysis.records import alone_on_gpu, sharing
    from experiments import provenance

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"gpu-a.{other.pid}").touch()
        (tmp_path / f"gpu-b.{other.pid}").touch()
        assert provenance.gpu_jobs("gpu-a", tmp_path) == 2  # this process registers itself
        assert (tmp_path / f"gpu-a.{os.getpid()}").is_file()
    finally:
        other.kill()
        other.wait()
    assert provenance.gpu_jobs("gpu-a", tmp_path) == 1
    assert not (tmp_path / f"gpu-a.{other.pid}").exists()
    env = {"device": "cuda:0", "gpu_processes": None, "jobs_per_gpu": None}
    assert sharing({**env, "gpu_jobs": 2}) == ["2 harness processes on the GPU"]
    assert not alone_on_gpu({**env, "gpu_jobs": 2}) and alone_on_gpu({**env, "gpu_jobs": 1})
    assert not alone_on_gpu(env)  # an older record: it cannot tell
    assert alone_on_gpu({**env, "gpu_processes": 1})


def _identity(res: dict) -> dict:
    return common.run_identity(res, common.drop_for("accuracy"))


def test_weights_replaced_at_the_same_path_give_another_run_id(tmp_path):
    """kind=accuracy resumes its samples by run id: new weights at the same model.path (a GGUF
    file, or a checkpoint folder) must not resume the old weights' samples."""
    res = resolved(TINY, tmp_path / "r")
    gg = tmp_path / "g"
    gg.mkdir()
    (gg / "m.gguf").write_bytes(b"weights v1")
    res["model"] = {"name": "m", "source": "gguf", "path": str(gg), "gguf_file": "m.gguf",
                    "weights": "pretrained"}  # fmt: skip
    first = _identity(res)
    assert first["model"] and first["id"] == _identity(res)["id"]
    (gg / "m.gguf").write_bytes(b"weights v2, longer")
    assert _identity(res)["id"] != first["id"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"a")
    res["model"] = {"name": "m", "source": "hub", "path": str(ckpt), "weights": "pretrained"}
    before = _identity(res)["id"]
    (ckpt / "model.safetensors").write_bytes(b"bb")
    assert _identity(res)["id"] != before
    res["model"] = {"name": "m", "source": "gguf", "package": "pkg==1.0", "gguf_file": "m.gguf",
                    "path": None, "weights": "pretrained"}  # fmt: skip
    from eval.tokenizers import VERIFY_VERSION  # GGUF runs: the tokenizer verification too

    assert _identity(res)["model"] == f"pkg==1.0; tokenizer verified v{VERIFY_VERSION}"


def test_a_benchmark_file_replaced_at_the_same_path_gives_another_run_id(tmp_path):
    res = resolved(TINY, tmp_path / "r")
    data = tmp_path / "data.json"
    data.write_text('[{"_id": "a"}]')
    plain = _identity(res)
    assert "benchmark_data" not in plain and "model" not in plain  # ids of such runs unchanged
    res["benchmark"] = {"name": "longbench_v2", "data": {"path": str(data)}}
    first = _identity(res)["id"]
    data.write_text('[{"_id": "b2"}]')
    assert _identity(res)["id"] != first


# --- values the run would silently ignore or change ---------------------------------------------


@pytest.mark.parametrize(
    "overrides, needle",
    [(["method=flexprefill", "tau=0.01"], r"tau=0\.01: .*method=flexprefill does not read it"),
     (["method=full", "S=128"], r"S=128: .*method\.segment_len.*method=full does not read it"),
     (["experiment=hparams_tau", "data=synthetic", "method=xattn"],
      r"the sweep key 'tau': .*method=xattn does not read it")],
)  # fmt: skip
def test_top_level_s2o_shortcuts_with_another_method_are_refused(overrides, needle, tmp_path):
    """Was: `python run.py method=flexprefill tau=0.01` ran FlexPrefill at its own tau=0.1."""
    with pytest.raises(ConfigError, match=needle):
        run_inprocess(overrides + TINY, tmp_path)
    assert not list(tmp_path.rglob("record.json"))


def test_top_level_shortcuts_read_by_the_config_are_kept(tmp_path):
    """S2O reads tau and S; a matched experiment reads S in its own block, whatever the method."""
    rec = run_inprocess(["method=s2o", "tau=0.02", "S=128", *TINY], tmp_path)
    assert rec["status"] == "ok" and rec["config"]["method"]["tau"] == 0.02
    cfg = compose(["experiment=calibration_check_default", "method=full", "S=128"])
    ctx = run.job_context(cfg)
    run.refuse_unread_shortcuts(run.prepare(cfg, ctx.overrides), ctx)  # matched.knobs reads S


@pytest.mark.parametrize(
    "override, needle",
    [("timing.rep=0", "timing.rep=0 must be >= 1"), ("timing.warmup=-1", "timing.warmup=-1"),
     ("kind=e2e e2e.reps=0", "e2e.reps=0 must be >= 1"),
     ("kind=e2e e2e.warmup=-2", "e2e.warmup=-2")],
)  # fmt: skip
def test_timing_counts_below_their_floor_are_refused_before_any_work(override, needle, tmp_path):
    """Was: timing.rep=0 was timed once while the record said rep=0. (The e2e block is kind=e2e's
    own, conf/kind/e2e.yaml: other kinds have none.)"""
    with pytest.raises(ConfigError, match=needle):
        run_inprocess([*override.split(), "dry_run=true"], tmp_path)
    assert not list(tmp_path.rglob("record.json"))


def test_bench_ms_refuses_rep_below_one():
    from experiments.timing import bench_ms

    with pytest.raises(ValueError, match=r"timing.rep=0 must be >= 1"):
        bench_ms(lambda: None, torch.device("cpu"), {"warmup": 0, "rep": 0})


def test_records_name_the_code_revision_with_its_dirty_marker():
    """A record's environment names the code it ran (a tree whose code differs from HEAD, such as
    a GPU machine's copy with a stale .git, gets +dirty.<hash>), or the revision given."""
    from experiments.provenance import code_revision, environment

    assert environment("cpu", None)["git_revision"] == code_revision(None)
    assert environment("cpu", "abc1234")["git_revision"] == "abc1234"


def test_reuse_is_decided_once_per_job(tmp_path, monkeypatch):
    """run.py asks experiments.records.reusable once for a top-level job (then computes through
    records.compute), and once again only when the rerun finds the record."""
    import run
    from experiments import records

    asked, real = [], records.reusable

    def counting(resolved, path):
        asked.append(path)
        return real(resolved, path)

    monkeypatch.setattr(run, "reusable", counting)
    monkeypatch.setattr(records, "reusable", counting)
    assert run_inprocess(TINY, tmp_path)["status"] == "ok"
    assert len(asked) == 1
    assert run_inprocess(TINY, tmp_path).get("skipped")
    assert len(asked) == 2
