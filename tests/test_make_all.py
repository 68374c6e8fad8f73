"""analysis/make_all.py: every artifact from the committed records, the same bytes twice, a line (not
a failure) for missing records. Runs on copies of results/ (never writes into the repo's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from harness_util import ROOT

from analysis import make_all


def _copy_results(dst: Path) -> Path:
    """results/ without the bulky run folders that no pinned record lives in."""
    ignore = shutil.ignore_patterns("*.log", "wandb")
    shutil.copytree(ROOT / "results", dst / "results", ignore=ignore)
    return dst / "results"


def _read_all(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("clone")
    _copy_results(root)
    return root


def test_make_all_rebuilds_the_committed_page_and_is_deterministic(built, monkeypatch):
    """A fresh clone that runs make_all has no diff in results/figures/ (text files byte for byte,
    every committed figure rewritten), and a second run writes the same bytes."""
    monkeypatch.chdir(built)
    shutil.rmtree(built / "results" / "figures")
    sections = make_all.main(["--results", "results"])
    first = _read_all(built / "results" / "figures")
    make_all.main(["--results", "results"])
    second = _read_all(built / "results" / "figures")
    assert first == second, [k for k in first if first[k] != second.get(k)]
    committed = _read_all(ROOT / "results" / "figures")
    for name in ("README.md", "ablations.md"):
        assert first[name] == committed[name], f"{name}: rerun python analysis/make_all.py"
    made = {f for s in sections for f in s.files}
    assert made <= set(committed), f"not committed: {sorted(made - set(committed))}"
    produced = {s.slug for s in sections if s.files}
    assert {"fig1", "fig2", "fig4a", "fig4b", "fig4c", "ablations"} <= produced, produced
    for slug in ("abcd", "retrieval"):
        assert any(s.slug == slug and s.sources for s in sections), slug


def test_missing_records_give_a_line_not_a_failure(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    sections = make_all.main(["--results", str(results)])
    page = (results / "figures" / "README.md").read_text()
    assert all(s.missing for s in sections), [s.slug for s in sections if not s.missing]
    assert page.count("**Missing records:**") >= len(sections)
    assert "Produced by:" in page


def test_a_broken_pin_gives_a_line_not_a_failure(tmp_path):
    results = _copy_results(tmp_path)
    manifest = yaml.safe_load((results / "manifest.yaml").read_text())
    manifest["records"]["kernels"]["abcd"] = "baselines/bench_baselines.json"  # wrong schema
    manifest["records"]["e2e"]["llama31_8b"] = "e2e/nowhere/record.json"
    (results / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    sections = {s.slug: s for s in make_all.main(["--results", str(results)])}
    assert sections["abcd"].missing and not sections["abcd"].files
    assert sections["fig1"].missing and not sections["fig1"].files
    assert sections["fig4c"].files  # the Qwen3 record is still pinned
