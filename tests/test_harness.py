"""The Hydra harness: every config composes, every experiment dry-runs, records, skip, errors."""

from __future__ import annotations

import json

import pytest
from harness_util import CONF, compose, run_cli, run_inprocess, scaled
from omegaconf import OmegaConf

import s2o

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
# the operator studies dry-run without weights; kind=accuracy files need a model's tokenizer
STUDIES = [e for e in EXPERIMENTS if not e.startswith("accuracy_")]
METHOD_FILES = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


def test_method_yaml_keys_equal_registry_defaults():
    for name in METHOD_FILES:
        if name not in s2o.METHODS:
            continue
        from s2o.methods.flashprefill import V2_KNOBS
        from s2o.methods.s2o import OPTIONAL_KNOBS

        keys = set(OmegaConf.load(CONF / "method" / f"{name}.yaml"))
        # FlashPrefill v2's knobs and S2O's mean_correction stay out of their files (a default
        # run's id stays what it was; see test_baselines' test_conf_keys_...)
        optional = {"flashprefill": set(V2_KNOBS), "s2o": set(OPTIONAL_KNOBS)}.get(name, set())
        want = set(s2o.METHODS[name].defaults) - optional
        assert keys == want, (
            f"conf/method/{name}.yaml keys {sorted(keys)} != defaults {sorted(want)}"
        )
    assert {"s2o", "full"} <= set(METHOD_FILES)


@pytest.mark.parametrize("method", METHOD_FILES)
def test_every_method_composes_and_resolves(method):
    import run
    from experiments.common import resolved_config

    cfg = compose([f"method={method}", "tau=0.01", "S=1024"])
    resolved = resolved_config(run.prepare(cfg), run.job_context(cfg))
    assert resolved["method_name"] == method
    if method == "s2o":
        assert resolved["method"]["tau"] == 0.01 and resolved["method"]["segment_len"] == 1024


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    cfg = compose([f"experiment={experiment}"])
    assert cfg.kind in ("operator", "sweep", "matched", "accuracy")
    assert (cfg.kind == "accuracy") == experiment.startswith("accuracy_")
    assert cfg.name == experiment
    if cfg.data.source == "model" and cfg.data.L >= 131072:
        assert cfg.data.text == "longbench_v2", "paper-scale runs must ask for the paper's text"


@pytest.mark.parametrize("study, scale", scaled())
def test_every_scaled_study_composes(study, scale):
    """`experiment=<study> scale=<preset>`: the study's kind, on the preset's model and essays
    within its context, named after the preset (its records: results/experiments/<name>/)."""
    kind = compose([f"experiment={study}"]).kind
    cfg = compose([f"experiment={study}", f"scale={scale}"])  # (its name reads the last compose's)
    assert cfg.kind == kind
    assert cfg.name.endswith(f"_{scale}") and cfg.name.split("_")[0] == study.split("_")[0]
    assert cfg.data.source == "model" and cfg.data.text == "essays"
    assert cfg.data.L <= cfg.model.max_len


def test_a_scale_needs_a_study_that_says_how_it_scales():
    with pytest.raises(Exception, match="scale/study/calibration_check_real"):
        compose(["experiment=calibration_check_real", "scale=gemma3_270m_8k"])


@pytest.mark.parametrize("launcher", ["local", "slurm", "node_gpus"])
def test_launchers_compose(launcher):
    cfg = compose([f"hydra/launcher={launcher}"])
    assert cfg.hydra.launcher._target_.endswith("Launcher")


@pytest.mark.parametrize("experiment", STUDIES)
def test_every_experiment_dry_runs(experiment, tmp_path):
    rec = run_inprocess([f"experiment={experiment}", "dry_run=true", "data=synthetic"], tmp_path)
    assert rec["status"] == "ok", rec.get("traceback")
    metrics = rec["metrics"]
    if rec["kind"] == "sweep":
        assert metrics["n_failed"] == 0, metrics["failed"]
        assert metrics["n_points"] >= 2
    if rec["kind"] == "matched":
        assert metrics["methods"]["s2o"]["status"] == "ok"
        assert metrics["methods"]["s2o"]["curve"], "no curve points"


@pytest.mark.parametrize("study, scale", scaled())
def test_every_scaled_study_dry_runs(study, scale, tmp_path):
    args = [f"experiment={study}", f"scale={scale}", "dry_run=true", "data=synthetic"]
    rec = run_inprocess(args, tmp_path)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["config"]["name"].endswith(f"_{scale}")
    metrics = rec["metrics"]
    if rec["kind"] == "sweep":
        assert metrics["n_failed"] == 0, metrics["failed"]
        assert metrics["n_points"] >= 2
    if rec["kind"] == "matched":
        assert metrics["methods"]["s2o"]["status"] == "ok"
        assert metrics["methods"]["s2o"]["curve"], "no curve points"


def test_default_command_writes_record(tmp_path):
    proc = run_cli(["method=s2o", "tau=0.005", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sparsity" in proc.stdout and "speedup" in proc.stdout, proc.stdout
    (path,) = tmp_path.glob("runs/s2o/*/record.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "ok"
    assert rec["config"]["method"]["tau"] == 0.005 and rec["config"]["method_name"] == "s2o"
    for key in ("mse", "mae", "sparsity", "density", "per_layer", "mse_per_head", "latency"):
        assert key in rec["metrics"], key
    for key in ("estimate_ms", "attention_ms", "total_ms", "full_ms", "speedup"):
        assert rec["metrics"]["latency"][key] is not None, key
    for key in ("device_name", "torch", "triton", "git_revision", "hostname", "time"):
        assert key in rec["environment"], key
    assert 0.0 <= rec["metrics"]["sparsity"] < 1.0
    assert rec["metrics"]["mse"] < 1e-2, rec["metrics"]["mse"]


def test_repeated_multirun_skips_and_failed_points_fail_the_sweep(tmp_path):
    args = ["-m", "method=s2o", "tau=0.005,0.02", "method.block_m=64,100", "dry_run=true",
            "timing.enabled=false"]  # fmt: skip
    first = run_cli(args, tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]
    assert "sweep: 2 of 4 points failed" in first.stderr, first.stderr[-3000:]
    assert first.stderr.count("method.block_m=100: ValueError") == 2, first.stderr[-3000:]
    recs = [json.loads(p.read_text()) for p in tmp_path.glob("runs/s2o/*/record.json")]
    status = sorted(r["status"] for r in recs)
    assert status == ["error", "error", "ok", "ok"], status
    err = next(r for r in recs if r["status"] == "error")
    assert "block_m=100" in err["error"] and "Traceback" in err["traceback"]
    second = run_cli(args, tmp_path)
    assert second.returncode == 1, second.stderr[-3000:]
    assert second.stdout.count("skip:") == 2, second.stdout


def test_in_process_sweep_reuses_single_run_records(tmp_path):
    single = run_inprocess(["experiment=hparams_tau", "data=synthetic", "dry_run=true",
                            "kind=operator", "tau=0.02"], tmp_path)  # fmt: skip
    assert single["status"] == "ok"
    sweep = run_inprocess(["experiment=hparams_tau", "data=synthetic", "dry_run=true"], tmp_path)
    skipped = {p["label"]: p["skipped"] for p in sweep["metrics"]["points"]}
    assert skipped == {"tau=0.005": False, "tau=0.02": True}, skipped


@pytest.mark.parametrize(
    "override, needle",
    [("taux=1", "taux"), ("method.gammma=0.5", "gammma"), ("data.Lx=4", "Lx"),
     ("method=nonexistent", "nonexistent")],
)  # fmt: skip
def test_bad_override_fails_naming_the_key(override, needle, tmp_path):
    proc = run_cli([override], tmp_path, timeout=60)
    assert proc.returncode != 0
    assert needle in proc.stderr, proc.stderr[-2000:]


def test_cuda_request_without_gpu_fails_clearly(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_inprocess(["device=cuda", "dry_run=true"], tmp_path)


def test_matched_ratios_best_baseline_over_s2o():
    """Best (lowest) baseline over S2O at each target; failed baselines and, at a target
    sparsity, methods whose bisection ended away from it (their knob range could not reach it)
    are left out."""
    from experiments.matched import ratios

    def at(*sparsity_mse):
        return [{"sparsity": sp, "mse": m} for sp, m in sparsity_mse]

    results = {
        "s2o": {"status": "ok", "at_sparsity": at((0.9, 2.0), (0.85, 4.0)),
                "at_mse": [{"density": 0.1}]},
        "a": {"status": "ok", "at_sparsity": at((0.899, 3.0), (0.95, 5.0)),
              "at_mse": [{"density": 0.4}]},
        "b": {"status": "ok", "at_sparsity": at((0.9, 5.0), (0.75, 0.5)),
              "at_mse": [{"density": 0.2}]},
        "missed": {"status": "ok", "at_sparsity": at((0.7, 1.0), (0.94, 6.0)),
                   "at_mse": [{"density": 0.9}]},
        "c": {"status": "error"},
    }  # fmt: skip
    out = ratios(results, {"target_sparsity": [0.9, 0.95], "target_mse": [1e-3]})
    assert out == {
        "mse_at_sparsity": [
            {"target": 0.9, "s2o": 2.0, "best_baseline": 3.0, "ratio": 1.5},
            # S2O ended at 0.85: no ratio; b at 0.75 is not matched either
            {"target": 0.95, "s2o": 4.0, "best_baseline": 5.0, "ratio": None},
        ],
        "density_at_mse": [{"target": 1e-3, "s2o": 0.1, "best_baseline": 0.2, "ratio": 2.0}],
    }
    assert ratios({"s2o": {"status": "error"}}, {}) == {}


def test_points_in_one_process_build_their_input_once(tmp_path, monkeypatch):
    """Operator points run in one process (local launcher, reused node_gpus workers) share the
    last input and its references when data, device and dtype agree, with the same metrics as
    a fresh process; other data replaces it."""
    from experiments import operator

    calls = []
    real = operator.load_layers

    def counting(*args, **kwargs):
        calls.append(args[0]["seed"])
        return real(*args, **kwargs)

    monkeypatch.setattr(operator, "load_layers", counting)
    monkeypatch.setattr(operator, "PROCESS_DATA", {})
    base = ["method=s2o", "dry_run=true", "timing.enabled=false", "skip_done=false"]
    run_inprocess([*base, "tau=0.01"], tmp_path / "a")
    second = run_inprocess([*base, "tau=0.05"], tmp_path / "b")
    assert len(calls) == 1, calls
    third = run_inprocess([*base, "tau=0.05", "data.seed=7"], tmp_path / "c")
    assert calls == [calls[0], 7]
    monkeypatch.setattr(operator, "PROCESS_DATA", {})
    fresh = run_inprocess([*base, "tau=0.05"], tmp_path / "d")
    assert len(calls) == 3
    for key in ("mse", "sparsity", "mse_per_head"):
        assert second["metrics"][key] == fresh["metrics"][key]
    assert third["metrics"]["mse"] != second["metrics"]["mse"]
