"""Before anything runs: a sweep's every point is checked before job #0 (a bad value refuses the
sweep, nothing runs), and the refusals a newcomer meets are one line naming the key they typed.
In-process and fast: composed configs, no model loads."""

from __future__ import annotations

from pathlib import Path

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


def test_an_all_digit_git_rev_is_refused_unless_quoted(tmp_path):
    """Hydra reads ``git_rev=6059204`` as an int, which landed in records as a number (their
    analysis sliced it as a string); quoted, it is a commit."""
    why = _refusal([*ACCURACY, "git_rev=6059204"], tmp_path)
    assert why is not None and why.startswith("git_rev=6059204 was read as a number (int)"), why
    assert _refusal([*ACCURACY, "git_rev='6059204'"], tmp_path) is None


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


QA = [*ACCURACY[:3], "benchmark.tasks=[qa_1]", "benchmark.n=1"]  # SQuAD: no file, so the hub


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """No network and empty Hugging Face caches: the hub's one request is refused (each is
    counted), a model load or a ``datasets`` download fails the test."""
    import importlib.util
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    import eval.models
    from eval.tasks import common

    if importlib.util.find_spec("datasets") is None:
        pytest.skip("without `datasets` the hub is never tried (test_no_datasets_package...)")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(eval.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    requests = []

    def urlopen(request, timeout):
        requests.append((request.full_url, timeout))
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    common.hub_unreachable.cache_clear()
    yield requests
    common.hub_unreachable.cache_clear()


def test_a_hub_dataset_is_refused_before_any_load_without_retries(no_hub, tmp_path):
    """qa_1 with no SQuAD file and no hub: one line naming ``benchmark.data.squad`` and how to
    supply the file, after one request with no retry (``datasets`` spent 26 s on 5 retries and
    about 20 warning lines, after the model load); a sweep's points share that request."""
    from eval.tasks.ruler.qa import HOW_TO_GET

    why = _refusal(QA, tmp_path)
    assert why == (
        "benchmark.data.squad: no file given and rajpurkar/squad_v2 is not in the local cache "
        "and the hub (https://huggingface.co) does not answer: [Errno -2] Name or service not "
        f"known; {HOW_TO_GET['squad']}"
    ), why
    assert no_hub == [("https://huggingface.co", 3.0)]
    assert _refusal([*QA, "seed=1"], tmp_path) == why and len(no_hub) == 1


def test_offline_asks_nothing_and_a_cached_set_or_file_passes(no_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    why = _refusal(QA, tmp_path)
    assert why.startswith("benchmark.data.squad: no file given and rajpurkar/squad_v2 is not "
                          "in the local cache and the hub is offline (HF_HUB_OFFLINE is set); "
                          "SQuAD v2 dev: dev-v2.0.json"), why  # fmt: skip
    squad = tmp_path / "dev-v2.0.json"
    squad.write_text("{}")
    assert _refusal([*QA, f"benchmark.data.squad={squad}"], tmp_path) is None
    (Path(constants.HF_HUB_CACHE) / "datasets--rajpurkar--squad_v2").mkdir(parents=True)
    assert _refusal(QA, tmp_path) is None
    assert no_hub == []


def test_samples_cached_from_the_hub_let_the_job_through(no_hub, tmp_path, monkeypatch):
    """RULER's qa samples made from the hub and cached (by some tokenizer) need no hub."""
    import json

    from eval.tasks.ruler import GENERATOR_VERSION

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "cache"
    job = [*QA, "benchmark.lengths=[1024,2048]", f"benchmark.cache_dir={cache}"]
    folder = cache / "ruler" / "qa_1"
    folder.mkdir(parents=True)
    for length in (1024, 2048):
        key = dict(benchmark="ruler", task="qa_1", length=length, tokenizer="t", seed=42, n=1,
                   version=GENERATOR_VERSION, data={"squad": "hub"})  # fmt: skip
        assert _refusal(job, tmp_path) is not None  # not every length cached yet
        (folder / f"{length}.key.json").write_text(json.dumps(key))
    assert _refusal(job, tmp_path) is None


def test_a_point_with_an_ok_record_is_not_refused_offline(no_hub, tmp_path, monkeypatch):
    """Its data is not read (the job is skipped): a finished sweep reruns offline."""
    import json

    from harness_util import compose

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose([*QA, "wandb.mode=disabled", f"results_dir={tmp_path}"])
    path = run.check(cfg, run.job_context(cfg))[2]
    assert run.refusal(cfg) is not None
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"status": "ok", "id": path.parent.name}))
    assert run.refusal(cfg) is None


def test_each_hub_backed_benchmark_names_its_data_key():
    """InfiniteBench's loaded tasks read ``benchmark.data.dir``, LongBench v2
    ``benchmark.data.path`` (generated tasks and a given file need no hub)."""
    from eval.tasks import base

    infinite, longbench = base.get("infinitebench"), base.get("longbench_v2")
    (got,) = infinite.hub_data({"tasks": ["passkey-style", "En.QA"], "data": {"dir": None}})
    assert got[:2] == ("dir", "xinrongzhang2022/InfiniteBench"), got
    assert "longbook_qa_eng.jsonl" in got[2] and "passkey" not in got[2], got
    assert infinite.hub_data({"tasks": ["passkey-style"], "data": {"dir": None}}) == []
    assert infinite.hub_data({"tasks": ["En.QA"], "data": {"dir": "/x"}}) == []
    assert [x[:2] for x in longbench.hub_data({"data": {"path": None}})] == [
        ("path", "THUDM/LongBench-v2")]  # fmt: skip
    assert longbench.hub_data({"data": {"path": "/x/data.json"}}) == []


def test_no_datasets_package_is_refused_without_a_request(tmp_path, monkeypatch):
    import importlib.util

    from eval.tasks import common

    find_spec = importlib.util.find_spec

    def no_datasets(name, *args):
        return None if name == "datasets" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_datasets)
    monkeypatch.setattr(common, "hub_unreachable", lambda: pytest.fail("the hub was asked"))
    why = _refusal(QA, tmp_path)
    assert why.startswith("benchmark.data.squad: no file given and the `datasets` package is "
                          "not installed; SQuAD v2 dev"), why  # fmt: skip


def test_the_command_line_refuses_an_offline_hub_dataset_in_one_line(tmp_path, monkeypatch):
    from harness_util import run_cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    out = run_cli([*QA, "method=full"], tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("error: benchmark.data.squad: no file given and "), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list(tmp_path.rglob("record.json"))


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


def test_m_after_the_overrides_starts_the_sweep(tmp_path):
    """``tau=abc,0.01 -m S=64``: argparse refused overrides on both sides of an option (its
    8-line usage, exit 2); Hydra's options go first, so it is the sweep ``-m tau=abc,0.01 S=64``
    (here refused before job #0: its bad point is named)."""
    from harness_util import run_cli

    assert run.options_first(["tau=0.01", "-m", "S=64"]) == ["-m", "tau=0.01", "S=64"]
    assert run.options_first(["tau=1", "-c", "job", "S=2", "--info", "x=1"]) == [
        "-c", "job", "tau=1", "S=2", "x=1", "--info"]  # fmt: skip
    assert run.options_first(["tau=1", "--info", "plugins"]) == ["--info", "plugins", "tau=1"]
    out = run_cli(["tau=abc,0.01", "-m", "S=64"], tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.splitlines()
    assert err[0].startswith("error: sweep not started: 1 of 2 points refused"), err
    assert err[1] == "  #0 tau=abc: tau='abc' must be a number", err
    assert not list(tmp_path.rglob("record.json"))


def test_a_bad_option_value_is_one_line():
    """argparse printed its usage for these, Hydra a traceback for two commands."""
    bad = "argument --cfg/-c: invalid choice: 'jobs' (choose from 'job', 'hydra', 'all')"
    assert run.argv_error(["--cfg", "jobs"]) == bad
    assert run.argv_error(["tau=1", "--cfg"]) == "argument --cfg/-c: expected one argument"
    two = "only one of --run, --multirun, --cfg, --info and --shell-completion at a time"
    assert run.argv_error(["-m", "--cfg", "job", "tau=1"]) == two
    assert run.argv_error(["-m", "tau=1", "S=64"]) is None


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
