"""Before anything runs: a sweep's every point is checked before job #0 (a bad value refuses the
sweep, nothing runs), and the refusals a newcomer meets are one line naming the key they typed.
In-process and fast: composed configs, no model loads."""

from __future__ import annotations

import pytest
from harness_util import CONF

import run
from hydra_plugins.s2o_launchers.local import LocalLauncher

refusal = run.refusal  # preflight asks the task's module for it, as it asks run.py
RAN: list[list[str]] = []


def task(cfg) -> dict:
    RAN.append(cfg.tau)
    return {"status": "ok"}


def _launch(sweep: list[list[str]], results) -> None:
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext, RunMode

    setup_globals()
    common = ["dry_run=true", "wandb.mode=disabled", f"results_dir={results}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration("config", common, run_mode=RunMode.MULTIRUN)
        launcher = LocalLauncher()
        ctx = HydraContext(config_loader=loader, callbacks=Callbacks(config))
        launcher.setup(hydra_context=ctx, task_function=task, config=config)
        launcher.launch([job + common for job in sweep], 0)


@pytest.mark.parametrize("bad_at", [0, 1])
def test_a_bad_sweep_value_refuses_the_sweep_before_job_0(bad_at, tmp_path, capsys):
    """``-m 'tau=abc,0.0011'`` and ``'tau=0.0011,abc'``: no point runs, the bad one is named in
    one line, exit code 2."""
    sweep = [["tau=0.0011"], ["tau=0.0012"]]
    sweep.insert(bad_at, ["tau=abc"])
    RAN.clear()
    with pytest.raises(SystemExit) as exc:
        _launch(sweep, tmp_path)
    assert exc.value.code == 2
    assert RAN == [] and not list(tmp_path.rglob("record.json"))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: sweep not started: 1 of 3 points refused"), err
    assert err[1:] == [f"  #{bad_at} tau=abc: tau='abc' must be a number"], err


def _refusal(overrides: list[str], tmp_path) -> str | None:
    from harness_util import compose

    return run.refusal(compose([*overrides, "wandb.mode=disabled", f"results_dir={tmp_path}"]))


ACCURACY = ["kind=accuracy", "benchmark=ruler", "model=smollm2_135m",
            "benchmark.tasks=[niah_single_1]"]  # fmt: skip


@pytest.mark.parametrize("n", ["0", "-1", "abc"])
def test_benchmark_n_below_one_is_refused(n, tmp_path):
    """``benchmark.n=0`` used to load the model and write an ok record of no samples."""
    why = _refusal([*ACCURACY, f"benchmark.n={n}"], tmp_path)
    assert why is not None and why.startswith("benchmark.n="), why
    assert "must be a positive int" in why, why


def test_a_missing_benchmark_data_file_is_named_before_any_load(tmp_path, monkeypatch):
    import eval.models

    monkeypatch.setattr(eval.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    missing = tmp_path / "dev-v2.0.json"
    qa = [*ACCURACY[:3], "benchmark.tasks=[qa_1]", f"benchmark.data.squad={missing}"]
    why = _refusal(qa, tmp_path)
    assert why == f"benchmark.data.squad={missing}: no such file or folder", why


def test_model_path_may_name_the_gguf_file(tmp_path):
    """``model.path=/x/smol.gguf`` is the file itself, the same point as ``model.path=/x
    model.gguf_file=smol.gguf`` (it was refused as ``/x/smol.gguf/<default gguf_file>``)."""
    from harness_util import compose

    gguf = tmp_path / "smol.gguf"
    gguf.write_bytes(b"GGUF")
    common = [*ACCURACY, "benchmark.n=1", "wandb.mode=disabled", f"results_dir={tmp_path}"]
    as_file = compose([*common, f"model.path={gguf}"])
    cfg, resolved, path = run.check(as_file, run.job_context(as_file))
    assert (cfg.model.path, cfg.model.gguf_file) == (str(tmp_path), "smol.gguf")
    apart = compose([*common, f"model.path={tmp_path}", "model.gguf_file=smol.gguf"])
    assert run.check(apart, run.job_context(apart))[2] == path
    other = compose([*common, f"model.path={gguf}", "model.gguf_file=other.gguf"])
    assert "names another" in run.refusal(other)


@pytest.mark.parametrize(
    "kind, overrides",
    [("operator", []), ("sweep", ["experiment=hparams_tau", "data=synthetic"]),
     ("matched", ["experiment=matched_sparsity", "data=synthetic"]), ("e2e", ["kind=e2e"])],
)  # fmt: skip
def test_ctrl_c_is_one_line_and_exit_130_in_every_kind(kind, overrides, tmp_path, monkeypatch,
                                                       capsys):  # fmt: skip
    """Ctrl-C while a point computes: one line (what was saved, the command that resumes), exit
    130, no traceback (kind=accuracy says how many samples it saved: tests/test_accuracy.py)."""
    import importlib

    from harness_util import compose

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(f"experiments.{kind}"), "run", ctrl_c)
    cfg = compose([*overrides, "dry_run=true", "wandb.mode=disabled", f"results_dir={tmp_path}"])
    with pytest.raises(SystemExit) as exc:
        run.job(cfg)
    assert exc.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted: the point in progress left no"), err
    assert "rerun the same command to resume" in err[0], err
    assert not list(tmp_path.rglob("record.json"))


@pytest.mark.parametrize(
    "override, line",
    [("tua=1", "tua: no such key (did you mean 'tau'?)"),
     ("methd=s2o", "methd: no such key (did you mean 'method'?)"),
     ("method=flexprefil", "method=flexprefil: no such option (did you mean 'flexprefill'?); "
                           "options: flashprefill, flexprefill, full, pbs, s2o, xattn"),
     ("tau=(", "Error parsing override 'tau=(': extraneous input '('")],
)  # fmt: skip
def test_hydra_mistakes_are_one_line_with_a_close_match(override, line, capsys):
    from harness_util import compose

    with pytest.raises(SystemExit) as exc:
        run.one_line_errors(pytest.fail)(lambda: compose([override]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {line}"), err


def test_an_unknown_option_is_one_line_with_a_close_match():
    assert run.unknown_option(["-m", "tau=1"]) is None
    why = run.unknown_option(["--multrun", "tau=1"])
    assert why.startswith("--multrun: no such option (did you mean '--multirun'?)"), why


def test_a_job_error_and_a_failed_sweep_stay_hydras_to_report():
    from hydra_plugins.s2o_launchers.report import SweepFailed

    seen = []

    def hydras(func) -> None:
        try:
            func()
        except Exception as exc:  # noqa: BLE001
            seen.append(type(exc).__name__)

    for exc in (ValueError("a job's own"), SweepFailed("sweep: 1 of 2 points failed")):
        run.one_line_errors(hydras)(_raising(exc))
    assert seen == ["ValueError", "SweepFailed"]


def _raising(exc: Exception):
    def func():
        raise exc

    return func


def test_run_py_prints_a_hydra_mistake_in_one_line(tmp_path):
    from harness_util import run_cli

    proc = run_cli(["tua=1"], tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: tua: no such key (did you mean 'tau'?) (keys are strict; +tua=<value> adds one)"
    ]


@pytest.mark.parametrize(
    "typed, said",
    [("S=0", "ValueError: S must be a positive int, got 0"),
     ("method.segment_len=0", "ValueError: segment_len must be a positive int, got 0")],
)  # fmt: skip
def test_an_error_names_the_key_as_typed(typed, said, tmp_path):
    from harness_util import run_inprocess

    rec = run_inprocess([typed, "dry_run=true"], tmp_path)
    assert rec["status"] == "error" and rec["error"] == said, rec["error"]
