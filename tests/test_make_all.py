"""analysis/make_all.py: every artifact from the committed records, the same bytes twice, a line
(not a failure) for missing records; the calibration fit at a tiny size. Runs on copies of results/
(never writes into the repo's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from harness_util import ROOT

from analysis import ablations, bench_sections, fig1, fig4a, fig4b, fig4c, loop_speed, make_all


def _copy_results(dst: Path) -> Path:
    """results/ without the bulky run folders that no pinned record lives in."""
    ignore = shutil.ignore_patterns("*.log", "wandb")
    shutil.copytree(ROOT / "results", dst / "results", ignore=ignore)
    return dst / "results"


def _read_all(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(root, sections, files)``: a copy of results/ under ``root`` whose figures/ make_all
    rebuilt from nothing, run from ``root`` as in a fresh clone; one build (about 30 s) that the
    tests of the page read."""
    root = tmp_path_factory.mktemp("clone")
    _copy_results(root)
    shutil.rmtree(root / "results" / "figures")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        sections = make_all.main(["--results", "results"])
    return root, sections, _read_all(root / "results" / "figures")


def test_make_all_rebuilds_the_committed_page_and_is_deterministic(built, monkeypatch):
    """A fresh clone that runs make_all has no diff in results/figures/ (text files byte for byte,
    every committed figure rewritten), and a second run writes the same bytes."""
    root, sections, first = built
    monkeypatch.chdir(root)
    make_all.main(["--results", "results"])
    second = _read_all(root / "results" / "figures")
    assert first == second, [k for k in first if first[k] != second.get(k)]
    committed = _read_all(ROOT / "results" / "figures")
    for name in ("README.md", "ablations.md"):
        assert first[name] == committed[name], f"{name}: rerun python analysis/make_all.py"
    made = {f for s in sections for f in s.files}
    assert made <= set(committed), f"not committed: {sorted(made - set(committed))}"
    produced = {s.slug for s in sections if s.files}
    # every section whose records are pinned produces its files (a record the section cannot
    # read turns it into a "missing records" line, as a Wilson bound of 3e-15 below 0 once did)
    expected = {
        "fig1",
        "fig2",
        "fig4a",
        "matched_points",
        "fig4b",
        "fig4c",
        "ablations",
        "accuracy",
        "fig5",
        "calibration",
    }
    assert expected <= produced, sorted(expected - produced)
    for slug in ("abcd", "retrieval"):
        assert any(s.slug == slug and s.sources for s in sections), slug


def test_the_readme_quotes_generated_lines_verbatim(built):
    """Every summary line the README or a page of docs/ quotes ("> ... tokens: ...", or a page's
    "what this page shows" line) is a line of
    the pages make_all generates from the pinned records, so a new record cannot leave a stale
    quote behind."""
    _, _, files = built  # the pages make_all generated from the pinned records
    pages = "\n".join(text.decode() for name, text in files.items() if name.endswith(".md"))
    summary = "**What this page shows** (generated): "
    generated = {line[2:] for line in pages.splitlines() if line.startswith("- ")}
    generated |= {line.removeprefix(summary) for line in pages.splitlines()
                  if line.startswith(summary)}  # fmt: skip
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    kinds = (" tokens: ", "informative comparisons")
    quoted = [line[2:] for doc in docs for line in doc.read_text().splitlines()
              if line.startswith("> ") and any(k in line for k in kinds)]  # fmt: skip
    assert quoted, "neither the README nor docs/ quotes a generated line"
    stale = [q for q in quoted if q not in generated]
    assert not stale, f"README or docs/ quote lines no page generates (rerun make_all): {stale}"


def test_differs_notes_name_the_input_the_pinned_records_ran_on(tmp_path, monkeypatch):
    """Fig. 4a's and Fig. 4b's notes come from the records: a 128K record whose knobs are the
    calibration fit's is named calibrated; pinned to a record of other knobs, the same section
    says so, with that record's ratios, and no longer calls the input calibrated."""
    results = _copy_results(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()

    def ctx():
        manifest = yaml.safe_load((results / "manifest.yaml").read_text())
        return make_all.Ctx(results, tmp_path / "out", manifest, make_all.paper_numbers())

    text = "\n".join(fig4a.section(ctx()).body)
    assert "calibrated synthetic input (`eval/synthetic.py`), L=131072" in text, text
    assert "1.41x to 1.55x" in text, text  # the pinned record's own ratio range
    assert "calibrated synthetic input" in fig4b.section(ctx()).body[-1]
    manifest = yaml.safe_load((results / "manifest.yaml").read_text())
    old = "experiments/fig4a_mse_vs_sparsity/70b28823a404/record.json"  # default knobs, H200
    manifest["experiments"]["fig4a_mse_vs_sparsity"] = old
    (results / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    text = "\n".join(fig4a.section(ctx()).body)
    assert "synthetic (uncalibrated knobs) input" in text, text
    assert "knobs other than the calibration fit's (sink 12.0, background 0.5)" in text, text
    assert "calibrated synthetic input (`eval" not in text, text


def test_missing_records_give_a_line_not_a_failure(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    sections = make_all.main(["--results", str(results)])
    page = (results / "figures" / "README.md").read_text()
    assert all(s.missing for s in sections), [s.slug for s in sections if not s.missing]
    assert page.count("**Missing records:**") >= len(sections)
    assert "Produced by:" in page


def test_a_broken_pin_gives_a_line_not_a_failure(tmp_path, monkeypatch):
    """Each section that reads one of the two pins broken here gives a line where its records
    were, and the page is written. Those are the sections whose output the two pins change
    (compared with a full build of both manifests: fig1, fig4c, loop_speed, ablations, abcd); the
    others write what they write in the full build the tests above check (66 s here, 6 s these)."""
    readers = (fig1.section, fig4c.section, loop_speed.section, ablations.section,
               bench_sections.abcd)  # fmt: skip
    monkeypatch.setattr(make_all, "SECTIONS", tuple(s for s in make_all.SECTIONS if s in readers))
    assert len(make_all.SECTIONS) == len(readers)
    results = _copy_results(tmp_path)
    manifest = yaml.safe_load((results / "manifest.yaml").read_text())
    manifest["records"]["kernels"]["abcd"] = "baselines/bench_baselines.json"  # wrong schema
    manifest["records"]["e2e"]["llama31_8b"] = "e2e/nowhere/record.json"
    (results / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    sections = {s.slug: s for s in make_all.main(["--results", str(results)])}
    assert sections["abcd"].missing and not sections["abcd"].files
    assert sections["fig1"].missing and not sections["fig1"].files
    assert sections["fig4c"].files  # the Qwen3 record is still pinned


def test_calibration_fit_runs_at_a_tiny_size(tmp_path):
    """The calibration fit (experiments/calibration_fit.py over eval/calibrate.py) end to end on
    the generator's own statistics (no model): a conf/data file that composes with the harness's
    synthetic keys, and a record with targets, trace and fit."""
    from omegaconf import OmegaConf

    from eval import calibrate
    from eval.synthetic import spec_from_cfg
    from experiments import calibration_fit

    conf, rec_path = tmp_path / "calibrated.yaml", tmp_path / "fit.json"
    rec = calibration_fit.main(
        [
            "--synthetic-target",
            "--L",
            "1536",
            "--fit-heads",
            "2",
            "1",
            "--max-evals",
            "8",
            "--out",
            str(conf),
            "--record",
            str(rec_path),
        ]
    )
    assert set(rec["target"]) == set(calibrate.STATS) and rec["evals"] >= 6
    assert rec["loss"] <= rec["trace"][0]["loss"] + 1e-12
    data = OmegaConf.to_container(
        OmegaConf.merge({"seed": 0}, {"d": OmegaConf.load(conf)}), resolve=True
    )["d"]
    synthetic = OmegaConf.load(ROOT / "conf" / "data" / "synthetic.yaml")
    assert set(data) == set(synthetic), set(data) ^ set(synthetic)
    assert spec_from_cfg(data).sink == rec["knobs"]["sink"]


def test_calibration_statistics_see_the_planted_structures():
    import torch

    from eval.calibrate import attention_stats
    from eval.synthetic import SyntheticSpec, synthetic_qkv

    def stats(**kw):
        q, k, _ = synthetic_qkv(SyntheticSpec(L=1536, heads_q=1, heads_kv=1, head_dim=64, **kw))
        return attention_stats(q[0, 0], k[0, 0])

    base = stats(sink=0.0, heavy=0.0, slash=0.0, horizontal=0.0)
    assert stats(sink=8.0, heavy=0.0, slash=0.0, horizontal=0.0)["sink"] > 10 * base["sink"]
    # (slash is not checked: at head_dim 64 its RoPE content raises the far keys' logit spread as
    # much as the band's, so the band's share of the mass does not grow; see the figures README)
    assert (
        stats(sink=0.0, heavy=0.0, slash=0.0, horizontal=0.0, background=2.0)["background_std"]
        > 1.5 * base["background_std"]
    )
    assert stats(sink=0.0, heavy=6.0, slash=0.0, horizontal=0.0)["heavy"] > 3 * base["heavy"]
    drift = stats(sink=0.0, heavy=0.0, slash=0.0, horizontal=0.0, drift=6.0, drift_len=150.0)
    assert drift["band_excess"] > 2.0 > 0.5 > abs(base["band_excess"]), (drift, base)
    assert drift["local"] > 3 * base["local"], (drift, base)
    topics = stats(sink=0.0, heavy=0.0, slash=0.0, horizontal=0.0, topics=6.0, topic_frac=0.05)
    # the rows of a tile share their best far keys, which cluster in the regions of their topic
    assert topics["tile_share"] > base["tile_share"] + 0.1, (topics, base)
    assert topics["block_scatter"] < base["block_scatter"] - 0.2, (topics, base)
    from eval.calibrate import layer_stats, median_stats

    def spread(head_temp):
        spec = SyntheticSpec(L=1536, heads_q=3, heads_kv=1, head_dim=64, head_temp=head_temp)
        q, k, _ = synthetic_qkv(spec)
        return median_stats(layer_stats(q, k))["head_spread"]

    flat, spread_out = spread(0.0), spread(0.3)
    assert spread_out > flat + 0.5, (spread_out, flat)
    with pytest.raises(ValueError, match="too short"):
        attention_stats(torch.randn(64, 16), torch.randn(64, 16))


def test_calibration_check_table_from_matched_records(tmp_path):
    """The check's section from tiny dry-run records of the three calibration_check experiments."""
    from harness_util import run_inprocess

    from analysis import calibration_check, make_all

    results = tmp_path / "results"
    pins = {}
    for key in ("real", "calibrated", "default"):
        rec = run_inprocess([f"experiment=calibration_check_{key}", "dry_run=true"], results)
        assert rec["status"] == "ok", rec.get("traceback")
        found = sorted((results / "experiments" / f"calibration_check_{key}").glob("*/record.json"))
        pins[f"calibration_check_{key}"] = str(found[0].relative_to(results))
    layers = {"layer0": pins["calibration_check_real"]}
    seeds = {"seed1": pins["calibration_check_calibrated"]}
    records = {"calibration_real_by_layer": layers, "calibration_calibrated_seeds": seeds}
    manifest = {"experiments": pins, "records": records}
    (results / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    ctx = make_all.Ctx(results, tmp_path / "fig", manifest, {})
    (tmp_path / "fig").mkdir()
    sec = calibration_check.section(ctx)
    text = "\n".join(sec.body)
    assert "calibration_check.png" in sec.files
    assert "same order" in text and "real capture" in text
    assert "layer by layer" in text and any("layer0 only" in s for s in sec.sources)
    assert "Other draws" in text and "| seed1 |" in text and "on every pinned draw" in text
    assert any("calibration fit record" in m for m in sec.missing)


def test_every_artifact_lives_in_its_own_module():
    """make_all is the list of sections and the page; each artifact's code is in its own module
    (docs/architecture.md, step 7), so no section is written inline again."""
    inline = [make.__name__ for make in make_all.SECTIONS if make.__module__ == make_all.__name__]
    assert not inline, f"artifacts written inline in make_all.py: {inline}"
