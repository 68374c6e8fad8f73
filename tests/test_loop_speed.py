"""analysis/loop_speed.py on constructed records: the per-cell target check from sample_ms, where a
job's time went, and for records without sample_ms what elapsed_s allows (which of them hold the
model load, from the jobs' start times)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import loop_speed

T0 = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.timezone.utc)


def _line(i: int, prefill: float, decode: float, sample: float | None, task="niah_single_2"):
    line = {"id": f"ruler/{task}/32768/42/{i}", "task": task, "length": 32768, "score": 1.0,
            "prefill_ms": prefill, "decode_ms": decode, "loop_ms": prefill + decode,
            "decode_steps": 9}  # fmt: skip
    return line if sample is None else {**line, "sample_ms": sample}


def _write(root: Path, rid: str, method: str, lines: list[dict], elapsed: float, start_s: float,
           timing: dict | None = None, resumed: int = 0,
           model: str = "qwen25_coder_1p5b") -> Path:  # fmt: skip
    folder = root / "accuracy" / "ruler" / model / method / rid
    folder.mkdir(parents=True)
    metrics = {"method": method, "knobs": {}, "n_samples": len(lines), "resumed": resumed,
               "cells": []}  # fmt: skip
    if timing is not None:
        metrics["timing"] = timing
    time = (T0 + dt.timedelta(seconds=start_s)).isoformat(timespec="seconds")
    rec = {"status": "ok", "id": rid, "kind": "accuracy", "method": method, "elapsed_s": elapsed,
           "config": {"model": {"name": model}, "benchmark": {"evidence": False}},
           "environment": {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3",
                           "hostname": "vm", "git_revision": "abcdef0", "time": time},
           "metrics": metrics}  # fmt: skip
    (folder / "record.json").write_text(json.dumps(rec))
    (folder / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder / "record.json"


def _timing(lines, load, reused, build, wall, evidence, generate, score) -> dict:
    total = lambda k: sum(r[k] for r in lines) / 1e3
    return {"model_load_s": load, "model_reused": reused, "build_samples_s": build,
            "samples_run": len(lines), "samples_wall_s": wall, "sample_s_sum": total("sample_ms"),
            "loop_s_sum": total("loop_ms"), "prefill_s_sum": total("prefill_ms"),
            "decode_s_sum": total("decode_ms"), "evidence_probe_s_sum": evidence,
            "generate_one_s_sum": generate, "score_s_sum": score}  # fmt: skip


def test_measured_cells_check_the_target_and_the_job_adds_up(tmp_path):
    # cell A: samples of 1000 ms for 800 ms of work (1.25x exactly: met); cell B: 1300 over 1000
    lines = [_line(i, 500, 300, 1000) for i in range(3)]
    lines += [_line(i, 600, 400, 1300, task="vt") for i in range(2)]
    t = _timing(lines, 20.0, False, 2.0, 6.0, evidence=0.0, generate=4.8, score=0.1)
    rec = loop_speed.load(_write(tmp_path, "aaa", "s2o", lines, 30.0, 0, t))
    assert loop_speed.kind_of(rec) == "measured"
    cf = loop_speed.cell_frame([rec]).set_index("task")
    assert cf.loc["niah_single_2", "sample / (prefill+decode)"] == pytest.approx(1.25)
    assert cf.loc["niah_single_2", "target <= 1.25x"] == "met"
    assert cf.loc["vt", "sample / (prefill+decode)"] == pytest.approx(1.3)
    assert cf.loc["vt", "target <= 1.25x"] == "missed by 4%"
    assert cf.loc["vt", "outside loop ms"] == pytest.approx(300)
    assert cf.loc["vt", "ms / decode step"] == pytest.approx(400 / 9)
    (job,) = loop_speed.job_frame([rec]).to_dict("records")
    assert job["tokenize + answer text"] == pytest.approx(4.8 - 4.4)
    assert job["rest of samples"] == pytest.approx(5.6 - 4.8 - 0.1)
    assert job["between samples"] == pytest.approx(6.0 - 5.6)
    assert job["rest of job"] == pytest.approx(30.0 - 20.0 - 2.0 - 6.0)
    page = loop_speed.document([rec])
    assert "1 of 2 cells meet the target" in page and "sample_ms` (all were made" not in page
    # the record cannot say whether another process shared its GPU (no gpu_processes)
    assert set(cf["GPU"]) == {"unknown"}


def test_a_cell_says_when_its_gpu_was_shared(tmp_path):
    lines = [_line(i, 500, 300, 1000) for i in range(2)]
    path = _write(tmp_path, "bbb", "s2o", lines, 10.0, 0, _timing(lines, 1, False, 1, 2, 0, 2, 0))
    rec = json.loads(path.read_text())
    rec["environment"] |= {"gpu_processes": 3, "jobs_per_gpu": 3}
    path.write_text(json.dumps(rec))
    (gpu,) = loop_speed.cell_frame([loop_speed.load(path)])["GPU"]
    assert gpu == "shared: 3 processes on the GPU, 3 jobs per GPU"
    for processes, said in ((1, "alone"), (None, "unknown")):  # None: nvidia-smi listed none
        rec["environment"] |= {"gpu_processes": processes, "jobs_per_gpu": None}
        path.write_text(json.dumps(rec))
        (gpu,) = loop_speed.cell_frame([loop_speed.load(path)])["GPU"]
        assert gpu == said
    rec["environment"] = {**rec["environment"], "device": "cpu", "device_name": "x86_64"}
    path.write_text(json.dumps(rec))
    (gpu,) = loop_speed.cell_frame([loop_speed.load(path)])["GPU"]
    assert gpu == "none (CPU)"  # a CPU record: no GPU, shared or not


def test_records_without_sample_ms_say_what_elapsed_s_holds(tmp_path):
    """Three jobs of one process (each starts where the previous ended, same host and model):
    the first may hold the model load, the others do not, and their bound checks the target;
    a job started 60 s later, a resumed job and a job of another model are not chained."""
    work = [_line(i, 600, 200, None) for i in range(10)]  # 800 ms of work per sample
    first = _write(tmp_path, "f01", "full", work, 30.0, 0)  # 3.0 s a sample, load inside
    second = _write(tmp_path, "s02", "s2o", work, 9.6, 30.4)  # 960 ms: 1.2x
    third = _write(tmp_path, "x03", "xattn", work, 12.0, 40.6)  # 1200 ms: 1.5x
    later = _write(tmp_path, "p04", "pbs", work, 9.0, 112.0)
    resumed = _write(tmp_path, "r05", "flexprefill", work, 5.0, 121.0, resumed=4)
    other = _write(tmp_path, "o06", "full", work, 9.0, 52.6, model="gemma3_270m")
    recs = loop_speed.read([first, second, third, later, resumed, other])
    assert {loop_speed.kind_of(r) for r in recs} == {"derived"}
    df = loop_speed.derived_frame(recs, recs).set_index("method")
    holds, verdict = df["elapsed_s holds"], df["target <= 1.25x"]
    assert holds["full `f01`"].startswith("the model load, unless")
    assert verdict["full `f01`"] == "not checkable (load inside)"
    assert holds["s2o `s02`"] == "no model load (its job started where full `f01`'s ended)"
    assert verdict["s2o `s02`"] == "mean met (bound 1.20x)"
    assert df.loc["s2o `s02`", "elapsed / sample ms"] == pytest.approx(960)
    assert df.loc["s2o `s02`", "job outside loop / sample ms"] == pytest.approx(160)
    assert holds["xattn `x03`"].endswith("s2o `s02`'s ended)")
    assert verdict["xattn `x03`"] == "not checkable (bound above the target)"
    assert holds["pbs `p04`"].startswith("the model load, unless")  # 60 s after xattn ended
    assert holds["flexprefill `r05`"] == "only the 6 samples not resumed"
    assert holds["full `o06`"].startswith("the model load")  # another model: reloaded
    assert (df["sample_ms"] == "missing").all()
    page = loop_speed.document(recs)
    assert "No record read here has `sample_ms`" in page
    assert "Records without `sample_ms`" in page


def test_records_made_with_generate_are_counted_not_shown(tmp_path):
    old = [{k: v for k, v in _line(0, 100, 50, None).items() if k != "loop_ms"}]
    rec = loop_speed.load(_write(tmp_path, "g01", "full", old, 5.0, 0))
    assert loop_speed.kind_of(rec) == "pre_loop"
    page = loop_speed.document([rec])
    assert "1 more accuracy records were made before the decode loop" in page
    assert "| full `g01`" not in page


def _ctx(tmp_path, pins: dict) -> SimpleNamespace:
    (tmp_path / "out").mkdir(exist_ok=True)
    return SimpleNamespace(results=tmp_path, out=tmp_path / "out", manifest={"records": pins})


def test_make_all_section_from_the_pinned_records(tmp_path):
    work = [_line(i, 600, 200, None) for i in range(4)]
    a = _write(tmp_path, "f01", "full", work, 20.0, 0).relative_to(tmp_path)
    b = _write(tmp_path, "s02", "s2o", work, 3.6, 20.2).relative_to(tmp_path)
    old = [{k: v for k, v in r.items() if k != "loop_ms"} for r in work]
    c = _write(tmp_path, "g03", "pbs", old, 3.0, 500).relative_to(tmp_path)
    pins = {"retrieval": {"qwen": [str(a), str(b)]}, "accuracy": [str(c), str(a)]}
    assert loop_speed.pinned({"records": pins}) == [str(a), str(b), str(c)]
    sec = loop_speed.section(_ctx(tmp_path, pins))
    assert sec.files == ["loop_speed.md"] and (tmp_path / "out" / "loop_speed.md").is_file()
    assert sec.sources == [f"`results/{a}`", f"`results/{b}`"]
    assert len(sec.missing) == 1 and "records.loop_speed" in sec.missing[0]  # no sample_ms yet
    body = "\n".join(sec.body)
    assert "mean met (bound 1.12x)" in body and "1 more accuracy records" in body
    assert not body.startswith("## ")

    measured = [_line(i, 600, 200, 900) for i in range(4)]
    t = _timing(measured, 10.0, False, 1.0, 3.7, 0.0, 3.4, 0.01)
    d = _write(tmp_path, "m04", "s2o", measured, 15.0, 900, t).relative_to(tmp_path)
    sec = loop_speed.section(_ctx(tmp_path, {"loop_speed": [str(d)]}))
    assert sec.missing == [] and sec.sources == [f"`results/{d}`"]
    assert "1 of 1 cells meet the target" in "\n".join(sec.body)

    assert loop_speed.section(_ctx(tmp_path, {"accuracy": [str(c)]})).files == []


def test_cli_reads_a_folder_of_records(tmp_path):
    work = [_line(i, 600, 200, 1000) for i in range(2)]
    _write(tmp_path, "m01", "s2o", work, 5.0, 0)
    out = tmp_path / "page.md"
    loop_speed.main(["--root", str(tmp_path / "accuracy"), "--out", str(out)])
    assert "| qwen25_coder_1p5b | s2o `m01` | niah_single_2 | 32768 | 2 |" in out.read_text()


@pytest.fixture
def tiny_llama():
    """test_accuracy's tiny Llama and BPE tokenizer (the fixture's function, called directly)."""
    pytest.importorskip("transformers")
    from test_accuracy import model_and_tokenizer

    return model_and_tokenizer.__wrapped__()


def test_a_record_of_the_accuracy_loop_reads_as_measured(tmp_path, monkeypatch, tiny_llama):
    """The fields experiments/accuracy.py writes are the ones the page reads (tiny model, CPU)."""
    pytest.importorskip("transformers")
    pytest.importorskip("wonderwords")
    from harness_util import run_inprocess
    from test_accuracy import _job

    from experiments import accuracy

    model, tok = tiny_llama
    monkeypatch.setattr(accuracy, "_LOADED", {})
    monkeypatch.setattr(accuracy.models, "load", lambda *a, **k: (model, tok))
    run_inprocess(_job(tmp_path), tmp_path / "results")
    (path,) = (tmp_path / "results").glob("accuracy/**/record.json")
    rec = loop_speed.load(path)
    assert loop_speed.kind_of(rec) == "measured"
    cf = loop_speed.cell_frame([rec])
    assert list(cf["n"]) == [2, 2] and (cf["sample / (prefill+decode)"] >= 1).all()
    (job,) = loop_speed.job_frame([rec]).to_dict("records")
    assert not job["load reused"] and job["model load"] >= 0 and job["samples run"] == 4
    assert job["between samples"] >= 0 and job["rest of job"] >= 0


def test_a_load_after_the_first_is_checked_against_its_target(tmp_path):
    """Only jobs that loaded the model themselves with the tokenizer read from the verified cache
    (warm caches) count as a load after the first; 14 s meets the 15-s target, 46 s misses it."""
    lines = [_line(0, 500, 300, 1000)]
    recs = []
    for rid, load, reused, cached in (
        ("fast", 14.0, False, True),
        ("slow", 46.0, False, True),
        ("cold", 80.0, False, False),
        ("reuse", None, True, True),
    ):
        t = _timing(lines, load, reused, 0.1, 1.0, evidence=0.0, generate=0.9, score=0.0)
        path = _write(tmp_path, rid, "full", lines, 100.0, 0, t)
        rec = json.loads(path.read_text())
        rec["metrics"]["tokenizer"] = {"verified": {"cached": cached, "load_s": 0.5}}
        path.write_text(json.dumps(rec))
        recs.append(loop_speed.load(path))
    out = loop_speed.load_lines(recs)
    assert len(out) == 2, out
    assert out[0].endswith("took 14.0 s; target under 15 s: met.")
    assert out[1].endswith("took 46.0 s; target under 15 s: missed by 3.1x.")
    assert "### Model load after the first" in loop_speed.document(recs)


def test_decode_batch_column_only_where_a_job_batched(tmp_path):
    one = [_line(i, 500, 300, 1000) for i in range(2)]
    batched = [{**_line(i, 500, 40, 600), "decode_batch": b} for i, b in enumerate((8, 8, 1))]
    r1 = loop_speed.load(_write(tmp_path, "aaa", "full", one, 5.0, 0))
    r8 = loop_speed.load(_write(tmp_path, "bbb", "full", batched, 5.0, 10))
    assert "decode batch" not in loop_speed.cell_frame([r1]).columns
    cf = loop_speed.cell_frame([r1, r8]).set_index("method")
    assert cf.loc["full `aaa`", "decode batch"] == 1
    assert cf.loc["full `bbb`", "decode batch"] == pytest.approx(17 / 3)


def test_a_batched_job_is_compared_with_its_twin_one_at_a_time(tmp_path):
    """The page says on how many common samples a decode_batch job and its twin (the same config
    but decode_batch, the same weights) predict and score the same; a job of another config is
    no twin."""
    one = [dict(_line(i, 500, 300, 1000), prediction=f"p{i}") for i in range(4)]
    batched = [dict(x, decode_batch=4) for x in one]
    batched[2] = dict(batched[2], prediction="other", score=0.0)
    jobs = (("aaa", one), ("bbb", batched), ("ccc", one))
    paths = [_write(tmp_path, rid, "full", x, 5.0, 10 * k) for k, (rid, x) in enumerate(jobs)]
    recs = [loop_speed.load(p) for p in paths]
    for rec, b in zip(recs, (1, 4, 1)):
        rec["config"] = dict(rec["config"], kind="accuracy", device="cuda", decode_batch=b)
        rec["identity"] = {"model": "w"}
    recs[2]["config"]["benchmark"] = {"evidence": True}  # another config: not a twin
    (line,) = loop_speed.batch_agreement(recs)
    assert line.startswith("- full `bbb` (decode_batch 4, 4.0 rows a batch on the mean) against "
                           "full `aaa` (one at a time)")  # fmt: skip
    assert "the same prediction on 3 of 4 common samples, the same score on 3." in line
    assert "Batched decoding against one at a time" in loop_speed.document(recs)


def test_min_agreement_says_whether_batching_may_replace_one_at_a_time(tmp_path, capsys):
    """``--min-agreement F`` (the GPU session's check before it turns decode_batch on): exit 0 only
    where a batched record has a twin and every pair agrees on at least F of its samples."""
    one = [dict(_line(i, 500, 300, 1000), prediction=f"p{i}") for i in range(4)]
    batched = [dict(x, decode_batch=4) for x in one]
    batched[2] = dict(batched[2], prediction="other", score=0.0)
    for k, (rid, lines, b) in enumerate((("aaa", one, 1), ("bbb", batched, 4))):
        path = _write(tmp_path / "both", rid, "full", lines, 5.0, 10 * k)
        rec = json.loads(path.read_text())
        rec["config"] = dict(rec["config"], kind="accuracy", device="cuda", decode_batch=b)
        rec["identity"] = {"model": "w"}
        path.write_text(json.dumps(rec))
        if b == 1:
            (tmp_path / "alone").mkdir()
            (tmp_path / "alone" / "record.json").write_text(json.dumps(rec))
            shutil.copy(path.parent / "samples.jsonl", tmp_path / "alone")

    def code(root, share):
        with pytest.raises(SystemExit) as e:
            loop_speed.main(["--root", str(tmp_path / root), "--min-agreement", share])
        return e.value.code

    assert code("both", "0.75") == 0
    assert "the same prediction on 3 of 4 common samples" in capsys.readouterr().out
    assert code("both", "0.8") == 1
    assert code("alone", "0.5") == 1  # no batched record: no evidence either way
    assert "no record decoded in batches has a twin" in capsys.readouterr().out
    assert code("both", "1.5") == 2
    assert "--min-agreement=1.5 must be in (0, 1]" in capsys.readouterr().err
