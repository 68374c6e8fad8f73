"""analysis/accuracy_tables.py on hand-made kind=accuracy records: rows, paired comparisons (McNemar
on a constructed 2x2, the exact sign-flip test on fractional scores), Holm adjustment over the
page's family and the "not significant" flag it sets, the paper's numbers beside ours, and a
byte-identical figure."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from analysis import accuracy_tables as at
from experiments.accuracy import append_line, cells
from experiments.records import write_record

N = 20
FULL = [1] * 10 + [0] * 10
# s2o tau=0.01: 7 samples full gets right are lost, none gained (n10=0, n01=7): p = 2/2^7
LOSSY = [0] * 7 + [1] * 3 + [0] * 10
# s2o tau=0.1: 2 lost, 1 gained (n10=1, n01=2): p = 2 * (1 + 3) / 2^3 = 1
CLOSE = [0] * 2 + [1] * 8 + [1] + [0] * 9


def write(root, method: str, knobs: dict, scores: list, density: float, model="gemma3_270m",
          length=1024, vt=None, time="2026-11-23T10:00:00+00:00", rel_mse=None):  # fmt: skip
    """A record + samples.jsonl as experiments/accuracy.py writes them (its own helpers)."""
    rid = hashlib.sha1(json.dumps([method, knobs, length]).encode()).hexdigest()[:16]
    folder = root / "accuracy" / "ruler" / model / method / rid
    folder.mkdir(parents=True)
    lines = []
    for task, sc in (("niah_single_1", scores), ("vt", vt or [])):
        for i, s in enumerate(sc):
            line = {"id": f"ruler/{task}/{length}/42/{i}", "task": task, "length": length,
                    "prompt_tokens": length - 30, "new_tokens": 5, "prediction": "x",
                    "density": density, "density_per_layer": [density], "prefill_ms": 1.0,
                    "decode_ms": 2.0, "estimate_ms": 0.1, "gold": ["x"], "score": s,
                    **({} if rel_mse is None else {"rel_mse": rel_mse[i % len(rel_mse)]}),
                    }  # fmt: skip
            append_line(folder / "samples.jsonl", line)
            lines.append(line)
    metrics = {"benchmark": "ruler", "model": f"{model} weights", "method": method,
               "knobs": knobs, "n_samples": len(lines), "resumed": 0,
               "samples_file": str(folder / "samples.jsonl"), "cells": cells(lines),
               "template": "base"}  # fmt: skip
    rec = {"status": "ok", "id": rid, "kind": "accuracy", "method": method,
           "config": {"model": {"name": model}, "benchmark": {"name": "ruler"}},
           "identity": {"id": rid}, "environment": {"time": time, "device_name": "cpu"},
           "metrics": metrics,
           "elapsed_s": 1.0}  # fmt: skip
    write_record(folder / "record.json", rec)
    return folder / "record.json"


@pytest.fixture
def root(tmp_path):
    vt_full, vt_s2o = [1.0, 0.5, 1.0, 0.0] * 5, [0.5, 0.5, 1.0, 0.0] * 5
    write(tmp_path, "full", {"backend": "auto"}, FULL, 1.0, vt=vt_full)
    write(tmp_path, "s2o", {"tau": 0.01, "segment_len": 512}, LOSSY, 0.2, vt=vt_s2o)
    write(tmp_path, "s2o", {"tau": 0.1, "segment_len": 512}, CLOSE, 0.4, vt=vt_s2o)
    return tmp_path / "accuracy" / "ruler" / "gemma3_270m"


def _rows(text: str, heading: str) -> dict[str, list[str]]:
    block = text.split(heading, 1)[1].split("###", 1)[0]
    rows = [[c.strip() for c in ln.strip()[1:-1].split("|")]
            for ln in block.splitlines() if ln.startswith("| ")]  # fmt: skip
    return {r[0]: r for r in rows[1:]}


def test_table_rows_and_paired_comparisons(root, tmp_path):
    out = tmp_path / "t.md"
    at.main(["--root", str(root), "--out", str(out), "--fig", str(tmp_path / "f.png")])
    text = out.read_text()
    assert "differ from the paper's" in text
    rows = _rows(text, "### niah_single_1, length 1024 (n < 50)")
    assert list(rows) == ["full", "s2o tau=0.1", "s2o tau=0.01"], rows  # density descending
    assert rows["full"][1:6] == ["50.0 [29.9, 70.1]", "1.000", "0.000", "-", "20"], rows["full"]
    assert rows["full"][6:] == ["(reference)"] + [""] * 6
    # the family: 2 sparse records x 3 cells. Raw p: niah McNemar 0/7 -> 2/2^7, 1/2 -> 1; vt
    # (five -0.5 differences each) sign-flip 2/2^5; pooled tau=0.01 (12 losses) 2/2^12, pooled
    # tau=0.1 (-1, -1, +1, five -0.5) 38/2^8. Holm: 6 * 2/2^12, then 5 * 2/2^7 = 0.078125.
    assert "Family: the 6 informative comparisons" in text
    lossy = rows["s2o tau=0.01"]
    assert lossy[6] == "-35.0 (n=20)" and lossy[8:10] == ["McNemar 0/7", f"{2 / 2**7:.3g}"]
    # raw p = 0.0156 < 0.05 but Holm-adjusted 0.0781: no longer significant
    assert lossy[10:] == ["0.0781", "39.2", "not significant"], lossy  # MDD: k^2/n, k = 2.80
    assert rows["s2o tau=0.1"][8:11] == ["McNemar 1/2", "1", "1"]
    assert rows["s2o tau=0.1"][12] == "not significant"
    assert lossy[7].startswith("[-") and lossy[7].endswith("]"), lossy  # Tango interval
    vt = _rows(text, "### vt, length 1024")
    assert vt["s2o tau=0.1"][8:11] == ["sign-flip exact (2^5)", "0.0625", "0.25"], vt
    assert vt["s2o tau=0.1"][6] == "-12.5 (n=20)"
    pooled = _rows(text, "### all, length 1024")
    assert pooled["full"][5] == "40", pooled
    assert pooled["s2o tau=0.01"][9:] == [f"{2 / 2**12:.3g}", f"{6 * 2 / 2**12:.3g}",
                                          pooled["s2o tau=0.01"][11], "significant"]  # fmt: skip
    assert pooled["s2o tau=0.1"][9] == f"{38 / 2**8:.3g}"


def test_benjamini_hochberg_option(root):
    """The same family under BH: sorted raw p 2/2^12, 2/2^7, 2/2^5, 2/2^5, 38/2^8, 1 give the
    niah loss 6/2 * 2/2^7 = 0.0469 (min over the ranks above it), significant at 0.05."""
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    text = at.tables(recs, correction="bh")
    rows = _rows(text, "### niah_single_1, length 1024 (n < 50)")
    assert "| p BH |" in text and "BH-adjusted over that family" in text
    assert rows["s2o tau=0.01"][10:13:2] == ["0.0469", "significant"], rows["s2o tau=0.01"]
    vt = _rows(text, "### vt, length 1024")
    assert vt["s2o tau=0.1"][10] == f"{6 / 4 * 2 / 2**5:.3g}"  # rank 4 of 6: 0.09375


def test_mcnemar_p_on_the_constructed_table(root):
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    ref = next(r for r in recs if r["method"] == "full")
    lossy = next(r for r in recs if r["_label"] == "s2o tau=0.01")
    c = at.row(lossy, "niah_single_1", 1024, ref)["cmp"]
    assert (c["test"], c["n10"], c["n01"]) == ("mcnemar_exact", 0, 7)
    assert math.isclose(c["p_value"], 2 * math.comb(7, 0) / 2**7)


def test_paper_numbers_beside_ours_for_the_papers_model(tmp_path):
    write(tmp_path, "full", {}, FULL, 1.0, model="llama31_8b", length=8192)
    out = tmp_path / "t.md"
    at.main(["--root", str(tmp_path), "--out", str(out), "--fig", str(tmp_path / "f.png")])
    text = out.read_text()
    assert "tab:ruler_acc_sparsity" in text
    assert _rows(text, "### all, length 8192")["full"][-2:] == ["91.5", "0.000"]
    assert _rows(text, "### niah_single_1, length 8192")["full"][-2:] == ["-", "-"]


def test_stale_samples_are_refused(root):
    path = sorted(at.find(root))[0]
    append_line(path.with_name("samples.jsonl"), {"id": "extra", "task": "vt", "length": 1024,
                                                  "density": 1.0, "score": 1})  # fmt: skip
    with pytest.raises(SystemExit, match="the record says n=20"):
        at.load(path)


def test_figure_is_deterministic(root, tmp_path):
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    a, b = at.figure(recs, tmp_path / "a.png"), at.figure(recs, tmp_path / "b.png")
    assert a.stat().st_size > 5000
    assert a.read_bytes() == b.read_bytes()


def test_each_cell_is_compared_with_the_full_record_that_holds_it(tmp_path):
    """Two full records at two lengths (the newer at 8K): the 1K cell's comparison is against the
    1K full record, not '-' for want of shared ids with the newest one."""
    write(tmp_path, "full", {}, FULL, 1.0, length=1024, time="2026-11-23T10:00:00+00:00")
    write(tmp_path, "full", {}, FULL, 1.0, length=8192, time="2026-11-23T11:00:00+00:00")
    write(tmp_path, "s2o", {"tau": 0.01}, LOSSY, 0.2, length=1024)
    text = at.tables(list(at.groups([at.load(p) for p in at.find(tmp_path)]).values())[0])
    assert _rows(text, "### niah_single_1, length 1024")["s2o"][6] == "-35.0 (n=20)"
    assert _rows(text, "### niah_single_1, length 8192")["full"][6] == "(reference)"


def test_s2o_default_q_perm_is_labelled_as_it_took_effect(tmp_path):
    """q_perm: null runs two-pass with Q_perm: the default run and a sweep point naming
    q_perm=true share a label, and q_perm=false stands apart; rel. MSE is the samples' mean."""
    base = {"tau": 0.005, "variant": "two_pass"}
    write(tmp_path, "s2o", {**base, "q_perm": None}, FULL, 0.3, rel_mse=[1e-3, 3e-3])
    write(tmp_path, "s2o", {**base, "q_perm": False}, FULL, 0.35, rel_mse=[4e-4])
    recs = list(at.groups([at.load(p) for p in at.find(tmp_path)]).values())[0]
    assert sorted(r["_label"] for r in recs) == ["s2o q_perm=False", "s2o q_perm=True"]
    rows = _rows(at.tables(recs), "### niah_single_1, length 1024")
    assert rows["s2o q_perm=True"][4] == "2.00e-03" and rows["s2o q_perm=False"][4] == "4.00e-04"
    assert rows["s2o q_perm=True"][6] == "-"  # no full record: nothing to compare with


def test_pooled_cell_holds_only_records_with_every_task(root, tmp_path):
    """A sweep point run on niah_single_1 alone is left out of the pooled cell (its mean would
    be over other tasks than the full record's), and the table says so."""
    write(tmp_path / "x", "s2o", {"tau": 0.5, "segment_len": 512}, FULL, 0.1)  # no vt lines
    recs = [at.load(p) for p in at.find(root)] + [at.load(p) for p in at.find(tmp_path / "x")]
    at.labels(recs)
    text = at.tables(recs)
    pooled = _rows(text, "### all, length 1024")
    assert "s2o tau=0.5" not in pooled and "s2o tau=0.1" in pooled, pooled
    assert "Pooled over niah_single_1, vt; 1 records" in text
    assert "s2o tau=0.5" in _rows(text, "### niah_single_1, length 1024")


def test_spearman_hand_computed():
    assert at.spearman([1, 2, 3, 4], [10, 20, 30, 40])["rho"] == pytest.approx(1.0)
    assert at.spearman([1, 2, 3, 4], [4, 3, 2, 1])["rho"] == pytest.approx(-1.0)
    # ranks x: 0,1,2,3; y (ties averaged): 0.5,0.5,2,3 -> cov 4.5, var 5 and 4.5
    assert at.spearman([1, 2, 3, 4], [5, 5, 6, 7])["rho"] == pytest.approx(4.5 / (5 * 4.5) ** 0.5)
    assert at.spearman([1, 2], [1, 2]) is None and at.spearman([1, 2, 3], [1, 1, 1]) is None


def test_error_figure_needs_measured_error(root, tmp_path):
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    assert at.error_figure(recs, tmp_path / "e.png") is None  # no rel_mse in these samples
    write(tmp_path / "x", "s2o", {"tau": 0.2}, LOSSY, 0.3, rel_mse=[1e-3])
    write(tmp_path / "x", "s2o", {"tau": 0.3}, CLOSE, 0.2, rel_mse=[2e-3])
    more = recs + [at.load(p) for p in at.find(tmp_path / "x")]
    at.labels(more)
    a = at.error_figure(more, tmp_path / "a.png")
    assert a is not None and a.stat().st_size > 5000
    assert a.read_bytes() == at.error_figure(more, tmp_path / "b.png").read_bytes()


def test_prefill_time_column_only_for_unshared_gpu_records(root):
    """The prefill-time column appears when every record ran on a GPU that no other process
    shared (recorded since gpu_processes exists), never for CPU, older or shared records."""
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    assert "prefill ms" not in at.tables(recs)  # CPU records (no device: cuda)
    for r in recs:
        r["environment"].update(device="cuda:0", gpu_processes=1, jobs_per_gpu=None)
    text = at.tables(recs)
    assert "prefill ms" in text
    assert _rows(text, "### niah_single_1, length 1024 (n < 50)")["full"][5] == "1.0"
    recs[0]["environment"]["jobs_per_gpu"] = 4
    assert "prefill ms" not in at.tables(recs)
    recs[0]["environment"].update(jobs_per_gpu=None, gpu_processes=2)
    assert "prefill ms" not in at.tables(recs)
    del recs[0]["environment"]["gpu_processes"]  # an older record: sharing unknown
    assert "prefill ms" not in at.tables(recs)
    recs[0]["environment"]["gpu_processes"] = None  # nvidia-smi lists no process: unknown too
    assert "prefill ms" not in at.tables(recs)


def test_a_packed_record_reads_the_same_and_unpacks_to_the_same_bytes(tmp_path):
    """experiments.records pack: samples.jsonl.gz in place of samples.jsonl (a finished record
    only), the same rows on the page, reproducible bytes, and unpack restores the file."""
    from experiments import records

    path = write(tmp_path, "s2o", {"tau": 0.01}, LOSSY, 0.2, vt=[0.5, 1.0] * 10)
    plain = path.with_name("samples.jsonl")
    before, rows = plain.read_bytes(), at.load(path)["_samples"]
    packed = records.pack_samples(path)
    assert packed.name == "samples.jsonl.gz" and not plain.exists()
    assert len(packed.read_bytes()) < len(before)
    assert at.load(path)["_samples"] == rows
    assert records.sample_lines(path) == before.decode().splitlines()
    with pytest.raises(records.ConfigError, match="no such file"):
        records.pack_samples(path)  # packed already
    assert records.unpack_samples(path) == plain and plain.read_bytes() == before
    assert records.unpack_samples(path) is None  # nothing left to unpack
    again = records.pack_samples(path).read_bytes()
    records.unpack_samples(path)
    assert records.pack_samples(path).read_bytes() == again  # no time or name in the gzip header


def test_only_a_finished_record_is_packed(tmp_path):
    from experiments import records

    path = write(tmp_path, "full", {}, FULL, 1.0)
    rec = json.loads(path.read_text())
    write_record(path, {**rec, "status": "error"})
    with pytest.raises(records.ConfigError, match="not an ok record"):
        records.pack_samples(path)
    assert path.with_name("samples.jsonl").exists()


def test_partial_samples_pack_only_without_a_record(tmp_path):
    """--partial: the samples of a cut-off run (no record) are packed; a run with a record is not
    packed as partial."""
    from experiments import records

    path = write(tmp_path, "full", {}, FULL, 1.0)
    with pytest.raises(records.ConfigError, match="has a record"):
        records.pack_samples(path, partial=True)
    path.unlink()
    packed = records.pack_samples(path, partial=True)
    assert len(records.sample_lines(path)) == N and packed.exists()


def test_a_page_says_on_which_device_each_length_ran():
    """Records of one model made on a GPU and on the CPU: the page's Devices line names both,
    with their lengths, so a CPU cell is never read as a GPU one."""
    gpu = {
        "environment": {"device_name": "NVIDIA H100 80GB HBM3"},
        "metrics": {"cells": [{"length": 16384}, {"length": 32768}]},
    }
    cpu = {"environment": {"device_name": "x86_64"}, "metrics": {"cells": [{"length": 4096}]}}
    line = at._devices([gpu, gpu, cpu])
    assert line == ("Devices: NVIDIA H100 80GB HBM3 (2 records; lengths 16,384, 32,768); "
                    "x86_64 (1 record; lengths 4,096)."), line  # fmt: skip
