"""The accuracy pages' generated claims (analysis/accuracy_tables.py): each table's "what it
shows" lines carry the numbers of its tests; the capability gate marks a cell whose `full` scores
below the floor uninformative and keeps it out of the family and the pooled cell; the recipe
section compares each method under a recipe variant with RULER's construction."""

from __future__ import annotations

import hashlib
import json

import yaml

from analysis import accuracy_tables as at
from eval import significance as sig
from experiments.accuracy import append_line, cells
from experiments.records import write_record
from tests.test_accuracy_tables import CLOSE, FULL, LOSSY, root  # noqa: F401 (fixture)


def write(
    base,
    method: str,
    knobs: dict,
    by_task: dict[str, list],
    density: float = 0.5,
    name: str | None = None,
):
    """A record of experiment ``name``, its samples ``by_task[task]`` scores at length 1024."""
    key = [method, knobs, sorted(by_task)] + ([name] if name else [])
    rid = hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]
    folder = base / "accuracy" / "ruler" / "m" / method / rid
    folder.mkdir(parents=True)
    lines = []
    for task, scores in by_task.items():
        for i, s in enumerate(scores):
            line = {"id": f"ruler/{task}/1024/42/{i}", "task": task, "length": 1024,
                    "density": density, "density_per_layer": [density], "score": s, "gold": ["x"],
                    "prediction": "x", "prompt_tokens": 1000, "new_tokens": 5,
                    "prefill_ms": 1.0, "decode_ms": 2.0, "estimate_ms": 0.1}  # fmt: skip
            append_line(folder / "samples.jsonl", line)
            lines.append(line)
    metrics = {"benchmark": "ruler", "method": method, "knobs": knobs, "cells": cells(lines)}
    write_record(folder / "record.json", {
        "status": "ok", "id": rid, "kind": "accuracy", "method": method,
        "config": {"model": {"name": "m"}, "benchmark": {"name": "ruler"}, "name": name},
        "environment": {"time": "2026-11-23T10:00:00+00:00", "device_name": "cpu"},
        "metrics": metrics})  # fmt: skip


def _recs(folder):
    return list(at.groups([at.load(p) for p in at.find(folder)]).values())[0]


def test_claim_lines_carry_the_tests_numbers(root):  # noqa: F811
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    text = at.tables(recs, floor=25)
    c = sig.compare_paired(LOSSY, FULL)
    block = text.split("### niah_single_1, length 1024", 1)[1].split("###", 1)[0]
    want = (f"- s2o tau=0.01 vs full, niah_single_1 at 1,024 tokens: -35.0 points "
            f"[{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}], p=0.0156, p_holm=0.0781, n=20: no "
            f"significant difference after Holm; a difference of {100 * c['mdd']:.1f} points "
            "would have been detected with 80% power (before adjustment).")  # fmt: skip
    assert want in block, block
    assert "What it shows (generated from the tests above):" in block
    assert "Recipe: RULER's construction (`eval/tasks/ruler/`)." in block
    # the pooled loss of tau=0.01 (12 of 20 lost) survives Holm: the page's summary names it
    assert "**What this page shows** (generated): 1 of the 6 informative comparisons" in text
    assert "s2o tau=0.01 on all at 1,024 tokens (-23.8 points)" in text


def test_capability_gate(root):  # noqa: F811
    """full scores 50% on niah_single_1 and 62.5 on vt: a 55% floor gates niah out."""
    recs = [at.load(p) for p in at.find(root)]
    at.labels(recs)
    text = at.tables(recs, floor=55)
    niah = text.split("### niah_single_1, length 1024", 1)[1].split("###", 1)[0]
    assert "- Uninformative: `full` scores 50.0% here, below the 55% floor" in niah
    assert "| uninformative |" in niah and "vs full, niah" not in niah
    assert "Family: the 4 informative comparisons" in text  # vt and pooled, 2 each
    assert "Pooled over vt; not pooled: niah_single_1 (uninformative)" in text
    assert "1 cells are uninformative (`full` below 55%): niah_single_1 at 1,024 tokens" in text
    pooled = text.split("### all, length 1024", 1)[1]
    assert "| 20 |" in pooled  # the pooled cell now holds vt's 20 samples only


def test_floor_comes_from_settings():
    floor = yaml.safe_load(at.SETTINGS.read_text())["accuracy"]["dense_floor"]
    assert at.dense_floor() == float(floor)


def test_recipe_section(tmp_path):
    off, var = "niah_single_1", "niah_single_1[depth=50]"
    write(tmp_path, "full", {}, {off: [1] * 20, var: [1] * 20})
    write(tmp_path, "s2o", {"tau": 0.005}, {off: [1] * 20, var: [1] * 6 + [0] * 14})
    text = at.tables(_recs(tmp_path), floor=25)
    assert "Recipe: RULER's construction except depth=50 (`benchmark.data.recipe`" in text
    assert (
        "Pooled over niah_single_1; not pooled: niah_single_1[depth=50] (a recipe variant)" in text
    )
    section = text.split("Recipe ablation: which feature moves a method's accuracy", 1)[1]
    c = sig.compare_independent([1] * 6 + [0] * 14, [1] * 20)
    rows = [ln for ln in section.splitlines() if ln.startswith("| niah_single_1")]
    assert len(rows) == 2, rows  # full and s2o, each under depth=50
    s2o = [x.strip() for x in next(r for r in rows if "| s2o |" in r).split("|")[1:-1]]
    assert s2o[:8] == ["niah_single_1", "1024", "depth=50", "s2o", "100.0", "30.0", "-70.0",
                       f"[{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]"], s2o  # fmt: skip
    assert s2o[8] == f"{c['p_value']:.3g}" and s2o[9] == f"{min(1, 2 * c['p_value']):.3g}"
    assert "- s2o: 1 of 1 variants move its accuracy significantly after Holm (depth=50 on " in (
        section
    )
    assert "- full: 0 of 1 variants move its accuracy significantly after Holm." in section


def test_recipe_section_pairs_a_variant_with_its_own_experiments_official_run(tmp_path):
    """A wider table (another experiment) holding the official cell too gives every method two
    records there (labels then carry ids): each variant is still compared with the official run
    of its own experiment, and the section's rows and lines name the setting, not a record."""
    off, var = "niah_single_1", "niah_single_1[depth=50]"
    for method, knobs in (("full", {}), ("s2o", {"tau": 0.005})):
        write(tmp_path, method, knobs, {off: [1] * 20}, name="ablation")
        write(tmp_path, method, knobs, {off: [0] * 20}, name="table")
    write(tmp_path, "full", {}, {var: [1] * 20}, name="ablation")
    write(tmp_path, "s2o", {"tau": 0.005}, {var: [1] * 6 + [0] * 14}, name="ablation")
    text = at.tables(_recs(tmp_path), floor=25)
    section = text.split("Recipe ablation: which feature moves a method's accuracy", 1)[1]
    rows = [ln for ln in section.splitlines() if ln.startswith("| niah_single_1")]
    assert len(rows) == 2, rows
    s2o = [x.strip() for x in next(r for r in rows if "| s2o |" in r).split("|")[1:-1]]
    assert s2o[3:7] == ["s2o", "100.0", "30.0", "-70.0"], s2o  # the ablation's own 100%, not 0%
    assert "- s2o: 1 of 1 variants move its accuracy significantly after Holm" in section


def test_pooled_line_quotes_every_method_of_the_pooled_cell(tmp_path):
    """The page's generated pooled line per length names each method's pooled accuracy, density
    and Holm-adjusted test against `full`, with the numbers of the pooled table's rows."""
    a, b = "niah_single_1", "vt"
    write(tmp_path, "full", {}, {a: [1] * 20, b: [1] * 10 + [0] * 10}, density=1.0)
    write(tmp_path, "s2o", {"tau": 0.005}, {a: [1] * 8 + [0] * 12, b: [1] * 10 + [0] * 10},
          density=0.25)  # fmt: skip
    text = at.tables(_recs(tmp_path), floor=25)
    line = next(ln for ln in text.splitlines() if ln.startswith("- 2 tasks pooled at 1,024"))
    pooled = [x for x in text.split("### all, length 1024", 1)[1].splitlines()
              if x.startswith("| s2o")][0]  # fmt: skip
    assert "| 45.0 [" in pooled and "| -30.0 (n=40) |" in pooled and "| 0.00146 |" in pooled
    assert line.startswith("- 2 tasks pooled at 1,024 tokens: full 75.0%; s2o 45.0% at density "
                           "0.250 (-30.0 points, p Holm 0.00146)"), line  # fmt: skip
    assert line.endswith(" (n=40 a method)."), line


def test_small_n_heading_says_whether_every_row_is_small(tmp_path):
    write(tmp_path, "full", {}, {"vt": [1] * 50})
    write(tmp_path, "s2o", {"tau": 0.005}, {"vt": [1] * 20})
    text = at.tables(_recs(tmp_path), floor=25)
    assert "### vt, length 1024 (n < 50 in some rows)" in text, text
    only_small = tmp_path / "small"
    write(only_small, "full", {}, {"vt": [1] * 20})
    assert "### vt, length 1024 (n < 50)\n" in at.tables(_recs(only_small), floor=25)
