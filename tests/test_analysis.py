"""analysis/ reads records only: tables and Fig. 4a from tiny dry-run records; the published ones
from the records pinned in results/manifest.yaml."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from harness_util import CONF, ROOT, compose, run_inprocess

from analysis import ablation_tables, pin, plot_mse_vs_sparsity
from analysis.records import RECORD_KINDS, SCRATCH, describe, paper_numbers


def test_paper_numbers_match_the_published_tables():
    p = paper_numbers()
    rows = {(r[0], r[1]): r[2:] for r in p["hparams"]["rows"]}
    assert rows[(2048, 0.005)] == [0.877, 0.01535, 0.00323]
    assert rows[(4096, 0.005)] == [0.862, 0.01520, 0.00312]
    assert p["component"]["rows"]["with_qperm"] == [0.852, 0.00129, 1.87e-5]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    names = ("hparams_tau", "hparams_S", "component_ablation", "fig4a_mse_vs_sparsity")
    for name in (*names, *ablation_tables.CAPTURED):  # CAPTURED: conf/scale/ presets' records
        rec = run_inprocess([*pin.EXPERIMENTS[name].split(), "dry_run=true", "data=synthetic"], out)
        assert rec["status"] == "ok", rec.get("traceback")
    return out


def test_ablation_tables_put_ours_next_to_the_paper(results, tmp_path):
    ablation_tables.main(["--results", str(results), "--latest", "--out", str(tmp_path / "abl.md")])
    text = (tmp_path / "abl.md").read_text()
    assert "| 256 | 0.005 |" in text and "| 128 | 0.005 |" in text, text
    assert "| with_qperm |" in text and "0.852" in text, text
    assert "no ok record" not in text


def test_ablations_on_captured_attention_follow_without_paper_columns(results):
    """The Gemma 8K and 32K ablations get their own tables after the paper's, one group each,
    with no paper columns (the paper has no such S or length); the paper's tables keep theirs."""
    text = ablation_tables.document(results, use_latest=True)
    paper_part, at_8k, at_32k = text.split("## The same on real attention")
    assert "sparsity (paper)" in paper_part, text
    for part, L in ((at_8k, "8k"), (at_32k, "32k")):
        assert "sparsity (paper)" not in part, part
        assert f"hparams_tau_gemma3_270m_{L}" in part and "| with_qperm |" in part, part
    assert "no ok record" not in text


def test_fig4a_plot_from_records(results, tmp_path):
    out = tmp_path / "fig4a.png"
    plot_mse_vs_sparsity.main(["--results", str(results), "--latest", "--out", str(out)])
    assert out.stat().st_size > 5000


def _tracked_changes() -> str:
    cmd = ["git", "status", "--porcelain", "--untracked-files=no"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout


def test_published_tables_and_figure_rebuild_from_the_manifest(tmp_path, monkeypatch):
    """The committed ablations.md and Fig. 4a come from the pinned records, byte for byte, and
    the analysis scripts with their defaults modify no tracked file."""
    monkeypatch.chdir(ROOT)
    before = _tracked_changes()
    ablation_tables.main(["--out", str(tmp_path / "abl.md")])
    published = ROOT / "results" / "figures" / "ablations.md"
    assert (tmp_path / "abl.md").read_text() == published.read_text()
    plot_mse_vs_sparsity.main(["--out", str(tmp_path / "fig4a.png")])
    ablation_tables.main([])
    plot_mse_vs_sparsity.main([])
    for name in ("ablations.md", "fig4a_mse_vs_sparsity.png"):
        assert (SCRATCH / name).is_file(), name
    ignored = subprocess.run(["git", "check-ignore", "-q", str(SCRATCH / "ablations.md")], cwd=ROOT)
    assert ignored.returncode in (0, 128), "the analysis scripts' default output must be ignored"
    assert _tracked_changes() == before


def test_a_newer_record_changes_nothing_until_re_pinned(results, tmp_path):
    """Was: analysis took "the latest record", so any run (a CPU dry run) changed the figures."""
    pin.main(["--results", str(results), "--latest"])
    pinned_md = (results / "figures" / "ablations.md").read_text()
    manifest = (results / "manifest.yaml").read_text()
    newer = run_inprocess(["experiment=hparams_tau", "dry_run=true", "data=synthetic",
                           "sweep.grid.tau=[0.05]"], results)  # fmt: skip
    assert newer["status"] == "ok"
    out = tmp_path / "abl.md"
    ablation_tables.main(["--results", str(results), "--out", str(out)])
    assert out.read_text() == pinned_md, "a newer record changed the pinned table"
    ablation_tables.main(["--results", str(results), "--latest", "--out", str(out)])
    assert "| 256 | 0.05 |" in out.read_text()
    pin.main(["--results", str(results), "--latest"])
    assert (results / "manifest.yaml").read_text() != manifest
    assert "| 256 | 0.05 |" in (results / "figures" / "ablations.md").read_text()


def test_stale_points_are_marked_in_tables(results, tmp_path):
    (path,) = (results / "experiments" / "component_ablation").glob("*/record.json")
    rec = json.loads(path.read_text())
    rec["metrics"]["points"][0]["stale"] = {"code": "0123abc", "data": None, "path": "x"}
    stale_results = tmp_path / "r"
    target = stale_results / path.relative_to(results)
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(rec))
    text = ablation_tables.component_table(stale_results, use_latest=True)
    label = rec["metrics"]["points"][0]["label"]
    assert f"| {label} (stale) |" in text, text
    assert "STALE points" in text and label in text
    rec["_path"] = str(target)
    assert "STALE" in describe(rec)


def test_device_label_flags_a_shared_gpu():
    """A record whose GPU was shared (another process on it, or several launcher jobs) says so
    wherever analysis names its device: its times are not clean."""
    from analysis.records import device_label

    env = {"device_name": "NVIDIA H100 80GB HBM3", "gpu_processes": 1, "jobs_per_gpu": None}
    assert device_label(env) == "NVIDIA H100 80GB HBM3"
    assert device_label({"device_name": "cpu"}) == "cpu"  # older records: no such keys
    shared = device_label({**env, "gpu_processes": 4, "jobs_per_gpu": 4})
    assert shared.startswith("NVIDIA H100 80GB HBM3 (SHARED: 4 processes on the GPU, 4 jobs")
    assert "times not clean" in shared
    cpu = {"device": "cpu", "device_name": "x86_64"}  # a CPU record names the processor
    assert device_label(cpu) == "CPU (x86_64)"


def test_flashprefill_joins_the_pages_as_missing_records_never_a_number():
    from analysis import fig4b, make_all
    from analysis.sections import Section, missing_baselines

    ctx = make_all.Ctx(ROOT / "results", ROOT / "results/figures", {}, paper_numbers())
    assert "27.78x at 256K, 1.71x at 4K" in fig4b._flashprefill_paper(ctx, 131072)
    assert "none stands beside a row" in fig4b._flashprefill_paper(ctx, 131072)
    assert "at this figure's L=4096: 1.71x" in fig4b._flashprefill_paper(ctx, 4096)
    sec = Section("x", "x", "x")
    missing_baselines(sec, {"s2o", "flexprefill", "xattn", "pbs"}, "the record", "cmd")
    assert sec.missing == ["**Missing records:** flashprefill in the record. Produced by: cmd"]
    rec = {"config": {"method_name": "flashprefill",
                      "method": {"alpha": 0.18, "dense_tail_tiles": 2}}}  # fmt: skip
    assert "flashprefill" in fig4b.FIG4B
    assert fig4b._knobs(rec) == "alpha=0.18, dense_tail_tiles=2"
    page = (ROOT / "results/figures/README.md").read_text().split("## GPU runs")[0]
    for section in page.split("\n## "):
        rows = [ln for ln in section.splitlines() if "flashprefill" in ln and ln.startswith("|")]
        if not rows:
            continue
        # a row may stand only where one of the section's source records measured FlashPrefill
        paths = set(re.findall(r"`results/([^`]+/record\.json)`", section))
        recs = [json.loads((ROOT / "results" / p).read_text()) for p in paths]
        measured = [r for r in recs if r.get("method") == "flashprefill"
                    or "flashprefill" in json.dumps(r.get("metrics"))]  # fmt: skip
        assert measured, f"a table row names flashprefill without its records: {rows[0]}"


def test_pin_names_are_the_experiment_records_that_conf_makes():
    """pin.EXPERIMENTS (analysis.records.experiment_commands, read from conf/'s files) is what
    Hydra composes: each name's command makes a sweep or matched run of that name, and every
    experiment file of those kinds is in it."""
    for name, args in pin.EXPERIMENTS.items():
        cfg = compose(args.split())
        assert (cfg.name, cfg.kind in RECORD_KINDS) == (name, True), args
    commands = set(pin.EXPERIMENTS.values())
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        kind = compose([f"experiment={path.stem}"]).kind
        assert (kind in RECORD_KINDS) == (f"experiment={path.stem}" in commands), path.stem


def test_every_pinned_experiment_resolves():
    """results/manifest.yaml's `experiments:` pins: names pin.py knows, ok records of that name."""
    pins = yaml.safe_load((ROOT / "results" / "manifest.yaml").read_text())["experiments"]
    assert len(pins) >= 16
    for name, rel in pins.items():
        assert name in pin.EXPERIMENTS, name
        rec = json.loads((ROOT / "results" / rel).read_text())
        assert rec["status"] == "ok" and rec["config"]["name"] == name, rel
        assert rel.startswith(f"experiments/{name}/"), rel


def test_re_pinning_keeps_the_manifest_comments_and_the_records_block():
    """Was: pin.py dumped the whole manifest again, dropping every comment of ``records:``."""
    text = ("# header\nexperiments:\n  a: experiments/a/1/record.json\n"
            "  b: experiments/b/1/record.json\nrecords:\n  e2e:   # why this one\n"
            "    m: e2e/m/1/record.json\n  # a note\n"
            "  accuracy:\n  - accuracy/x/record.json  # kept\n")  # fmt: skip
    out = pin.replace_block(text, "experiments", {"a": "experiments/a/2/record.json"})
    assert out.startswith("# header\nexperiments:\n  a: experiments/a/2/record.json\nrecords:\n")
    assert out.endswith(text[text.index("records:") :])
    assert yaml.safe_load(out)["records"] == yaml.safe_load(text)["records"]
    assert pin.replace_block("records: {}\n", "experiments", {"a": "p"}) == (
        "records: {}\nexperiments:\n  a: p\n"
    )
