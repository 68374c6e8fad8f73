"""analysis/fronts.py on hand-made kind=accuracy records pinned under ``records.fronts``: the
settings read from the experiment's sweep points, one series per method ordered by density, the
defaults marked, a test family of the page's comparisons only, the sweep points still missing,
and a line (not a failure) for a pinned record that is gone."""

from __future__ import annotations

import hashlib
import json

import pytest
from harness_util import ROOT

from analysis import accuracy_tables as at
from analysis import fronts
from eval.significance import adjust_p
from experiments.accuracy import append_line, cells
from experiments.records import write_record

N = 20
L = 32768
TASKS = ("niah_multikey_2", "niah_single_2")
FULL = {"niah_multikey_2": [1] * 12 + [0] * 8, "niah_single_2": [1] * 20}
S2O = {"segment_len": 2048, "q_perm": None, "variant": "two_pass"}


def write(root, method: str, knobs: dict, scores: dict, density: float, name=fronts.EXPERIMENT):
    """A record + samples.jsonl as experiments/accuracy.py writes them (its own helpers)."""
    rid = hashlib.sha1(json.dumps([method, knobs, name]).encode()).hexdigest()[:12]
    folder = root / "accuracy" / "ruler" / fronts.MODEL / method / rid
    folder.mkdir(parents=True)
    lines = []
    for task in TASKS:
        for i, s in enumerate(scores[task]):
            line = {"id": f"ruler/{task}/{L}/42/{i}", "task": task, "length": L,
                    "prompt_tokens": L - 100, "new_tokens": 5, "prediction": "x",
                    "density": density + (0.01 if task == TASKS[0] else 0.0),
                    "density_per_layer": [density], "prefill_ms": 1.0, "decode_ms": 2.0,
                    "gold": ["x"], "score": s}  # fmt: skip
            append_line(folder / "samples.jsonl", line)
            lines.append(line)
    metrics = {"benchmark": "ruler", "model": "qwen", "method": method, "knobs": knobs,
               "n_samples": len(lines), "resumed": 0, "samples_file": str(folder / "samples.jsonl"),
               "cells": cells(lines), "template": "chat"}  # fmt: skip
    env = {"time": "2026-11-27T05:16:06+00:00", "device_name": "NVIDIA H100 80GB HBM3",
           "git_revision": "28c75f4"}  # fmt: skip
    rec = {"status": "ok", "id": rid, "kind": "accuracy", "method": method,
           "config": {"name": name, "model": {"name": fronts.MODEL, "gguf_file": "q.gguf"},
                      "benchmark": {"name": "ruler"}},
           "identity": {"id": rid, "code": "28c75f4"}, "environment": env, "metrics": metrics,
           "elapsed_s": 1.0}  # fmt: skip
    write_record(folder / "record.json", rec)
    return str((folder / "record.json").relative_to(root))


def _lose(k: int) -> dict:
    """Scores that lose ``k`` of full's correct niah_multikey_2 samples, niah_single_2 kept."""
    return {"niah_multikey_2": [0] * k + FULL["niah_multikey_2"][k:],
            "niah_single_2": FULL["niah_single_2"]}  # fmt: skip


@pytest.fixture
def pinned(tmp_path):
    """Seven of the experiment's 31 points, and one record of the defaults' table that is
    pinned under records.accuracy (not a fronts record)."""
    paths = [
        write(tmp_path, "full", {"backend": "auto"}, FULL, 1.0),
        write(tmp_path, "s2o", {**S2O, "tau": 0.005}, _lose(0), 0.36),  # the default
        write(tmp_path, "s2o", {**S2O, "tau": 0.02}, _lose(2), 0.18),
        write(tmp_path, "s2o", {**S2O, "tau": 0.05}, _lose(12), 0.10),  # loses, significantly
        write(tmp_path, "s2o", {**S2O, "tau": 0.005, "segment_len": 1024}, _lose(1), 0.34),
        write(tmp_path, "flexprefill", {"gamma": 0.9, "tau": 0.1}, _lose(0), 0.30),
        write(tmp_path, "flexprefill", {"gamma": 0.8, "tau": 0.1}, _lose(1), 0.20),
    ]
    other = write(tmp_path, "xattn", {"threshold": 0.9}, _lose(12), 0.2, "accuracy_qwen_ruler")
    manifest = {"records": {"fronts": {fronts.MODEL: paths}, "accuracy": [other]}}
    return tmp_path, manifest


def _build(pinned, tmp_path):
    results, manifest = pinned
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return fronts.build(results, out, manifest), out


def test_settings_are_the_sweep_points_with_the_defaults_from_conf():
    points = fronts.plan(ROOT / "conf" / "experiment" / f"{fronts.EXPERIMENT}.yaml")
    labels = [(p["method"], p["label"]) for p in points]
    assert len(points) == 31 and labels[0] == ("full", "full")
    for want in [("s2o", "tau=0.02"), ("s2o", "S=1024 tau=0.005"),
                 ("s2o", "q_perm=False tau=0.005"), ("flexprefill", "gamma=0.85")]:  # fmt: skip
        assert want in labels, want
    defaults = {(p["method"], p["label"]) for p in points if p["default"]}
    assert defaults == {("s2o", "tau=0.005"), ("flexprefill", "gamma=0.9"),
                        ("xattn", "threshold=0.9"), ("pbs", "threshold=0.9")}  # fmt: skip
    # FlashPrefill's default alpha is a resolver of the model (run.py): not known from conf/
    assert {p["default"] for p in points if p["method"] == "flashprefill"} == {None}
    q_off = next(p for p in points if p["label"] == "q_perm=False tau=0.02")
    assert q_off["knobs"] == {"tau": 0.02, "segment_len": 2048, "q_perm": False}
    with pytest.raises(ValueError, match="cannot read"):
        fronts.expand("method=s2o tau=range(1,3)")


def test_the_points_and_defaults_are_what_hydra_composes():
    """The jobs read from the file are the points sweeper's, each job's swept knobs are what
    Hydra composes for it, and a point is marked default exactly where they equal the knobs of
    ``method=<m>`` alone."""
    from harness_util import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    import run  # noqa: F401  (registers the flashprefill_alpha resolver)
    from hydra_plugins.s2o_sweepers.points import expand

    exp = f"experiment={fronts.EXPERIMENT}"
    cfg = compose([exp])
    parser = OverridesParser.create()
    jobs = expand(list(cfg.hydra.sweeper.points), [], parser)
    points = fronts.plan(ROOT / "conf" / "experiment" / f"{fronts.EXPERIMENT}.yaml")
    assert len(jobs) == len(points)

    def knobs(overrides):
        c = compose([exp, *overrides])
        method = c.hydra.runtime.choices.method
        k = OmegaConf.to_container(c.method, resolve=True)
        return at.knobs({"method": method, "metrics": {"knobs": k}})

    for job, p in zip(jobs, points):
        got = knobs(job)
        assert {k: got[k] for k in p["knobs"]} == p["knobs"], (job, p)
        default = knobs([f"method={p['method']}"])
        is_default = bool(p["knobs"]) and all(default[k] == v for k, v in p["knobs"].items())
        assert p["default"] in (is_default, None), (job, p)
        assert p["default"] is not None or p["method"] == "flashprefill", p


def test_series_per_method_ordered_by_density_defaults_marked(pinned, tmp_path):
    sec, out = _build(pinned, tmp_path)
    assert sec.files == [f"{fronts.STEM}.md", f"{fronts.STEM}.png"]
    assert (out / f"{fronts.STEM}.png").stat().st_size > 0
    results, manifest = pinned
    recs = [at.load(results / p) for p in fronts.pinned(manifest)]
    points = fronts.plan(ROOT / "conf" / "experiment" / f"{fronts.EXPERIMENT}.yaml")
    fronts.match(recs, points)
    done = fronts._cells(recs, at.dense_floor())
    for task, _, rows in done:
        lines = fronts.series(rows)
        assert list(lines) == ["s2o", "flexprefill"]  # one per sparse method, full apart
        for method, pts in lines.items():
            dens = [x["density"] for x in pts]
            assert dens == sorted(dens), (task, method)
            assert [x["label"] for x in pts if x["default"]] == [
                {"s2o": "s2o tau=0.005", "flexprefill": "flexprefill gamma=0.9"}[method]
            ]
        assert [x["setting"] for x in lines["s2o"]] == [
            "tau=0.05", "tau=0.02", "S=1024 tau=0.005", "tau=0.005"]  # fmt: skip
    page = (out / f"{fronts.STEM}.md").read_text()
    assert "| s2o | tau=0.005 (default) |" in page
    assert "| flexprefill | gamma=0.9 (default) |" in page
    assert "| full | - | 1.000 |" in page
    # rows by method (full, s2o, flexprefill), then density (denser first, as the other pages)
    table = page.split("## niah_multikey_2")[1].split("##")[0]
    rows = [ln.split("|")[1:3] for ln in table.splitlines() if ln.startswith("| ")]
    assert [(m.strip(), s.strip()) for m, s in rows[1:]] == [
        ("full", "-"), ("s2o", "tau=0.005 (default)"), ("s2o", "S=1024 tau=0.005"),
        ("s2o", "tau=0.02"), ("s2o", "tau=0.05"), ("flexprefill", "gamma=0.9 (default)"),
        ("flexprefill", "gamma=0.8")]  # fmt: skip


def test_the_family_is_the_page_own_comparisons(pinned, tmp_path):
    """Holm over the fronts' comparisons only (6 sparse records x 2 tasks): the records.accuracy
    record (which loses 12 samples) is neither a row nor a member of the family."""
    sec, out = _build(pinned, tmp_path)
    page = (out / f"{fronts.STEM}.md").read_text()
    assert "Family: the 12 informative comparisons" in page
    assert "xattn" not in page.split("## Sweep points without")[0]
    results, manifest = pinned
    recs = [at.load(results / p) for p in fronts.pinned(manifest)]
    fronts.match(recs, fronts.plan(ROOT / "conf" / "experiment" / f"{fronts.EXPERIMENT}.yaml"))
    done = fronts._cells(recs, at.dense_floor())
    cmps = [x["cmp"] for *_, rows in done for x in rows if x["cmp"] is not None]
    assert len(cmps) == 12
    assert [c["p_adj"] for c in cmps] == adjust_p([c["p_value"] for c in cmps], "holm")
    # tau=0.05 loses 12 of 12 on niah_multikey_2: McNemar p = 2/2^12, Holm x12 -> significant
    lossy = next(x for t, _, rows in done for x in rows
                 if t == "niah_multikey_2" and x["setting"] == "tau=0.05")  # fmt: skip
    assert lossy["cmp"]["p_value"] == pytest.approx(2 / 2**12)
    assert lossy["cmp"]["p_adj"] == pytest.approx(12 * 2 / 2**12)
    summary = next(ln for ln in sec.body if ln.startswith("**What this page shows**"))
    assert summary.startswith(
        "**What this page shows** (generated): 1 of the 12 informative comparisons against "
        "`full` is significant after Holm: s2o tau=0.05 on niah_multikey_2 at 32,768 tokens "
        "(-60.0 points)."
    ), summary
    # walking S2O from its densest setting, tau=0.05 is the first to lose: tau=0.02 is kept
    assert "s2o tau=0.02 (mean density 0.185; vs full: niah_multikey_2 -10.0" in summary
    assert "flexprefill gamma=0.8 (mean density 0.205" in summary
    assert summary in page


def test_the_missing_points_are_listed_per_method_with_their_command(pinned, tmp_path):
    sec, out = _build(pinned, tmp_path)
    missing = {m.split("'s fronts points ")[0].removeprefix("**Missing records:** "): m
               for m in sec.missing}  # fmt: skip
    assert list(missing) == ["s2o", "flexprefill", "xattn", "pbs", "flashprefill"]
    assert "tau=0.001, tau=0.002, tau=0.01, S=4096 tau=0.005, S=1024 tau=0.02, S=4096 tau=0.02, " \
           "q_perm=False tau=0.005, q_perm=False tau=0.02 (8 of 12)" in missing["s2o"]  # fmt: skip
    assert "gamma=0.85, gamma=0.95, gamma=0.99 (3 of 5)" in missing["flexprefill"]
    assert "threshold=0.8, threshold=0.9 (default), threshold=0.95, threshold=0.99 (4 of 4)" \
           in missing["xattn"]  # fmt: skip
    assert all(fronts.COMMAND in m for m in sec.missing)
    assert "hydra/launcher=node_gpus hydra.launcher.jobs_per_gpu=3" in fronts.COMMAND
    page = (out / f"{fronts.STEM}.md").read_text()
    assert "7 of its 31 sweep points have a pinned record" in page
    assert "- pbs: threshold=0.8, threshold=0.9 (default), threshold=0.95, threshold=0.99." in page


def test_a_missing_pinned_record_gives_a_line_not_a_failure(pinned, tmp_path):
    results, manifest = pinned
    gone = manifest["records"]["fronts"][fronts.MODEL][2]  # s2o tau=0.02
    (results / gone).unlink()
    sec, out = _build(pinned, tmp_path)
    assert sec.files  # the other six records still make the page
    assert any(f"`results/{gone}` (not found)" in m for m in sec.missing), sec.missing
    assert any("tau=0.02" in m and "s2o's fronts points" in m for m in sec.missing)
    assert "Family: the 10 informative comparisons" in (out / f"{fronts.STEM}.md").read_text()
    # nothing pinned at all: a line, no files
    empty = fronts.build(results, out, {"records": {}})
    assert not empty.files and empty.missing and "Produced by:" in empty.missing[0]
    # the whole make_all run: the section is there, with its line
    from analysis import make_all

    (results / "manifest.yaml").write_text(json.dumps(manifest))
    sections = {s.slug: s for s in make_all.main(["--results", str(results)])}
    assert sections["fronts"].files and sections["fronts"].missing
