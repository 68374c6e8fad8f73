"""The rules analysis needs are in the records (issue 30: analysis reads records only): a
kind=matched record holds its reach rule, a calibration fit record its statistics and bounds;
the committed records hold them too (written into them once by a one-off migration, gone since:
git show d52a72a)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from harness_util import ROOT


def _committed_rule_records() -> list[tuple[Path, str]]:
    """``(path, kind)`` of each tracked calibration fit record and kind=matched record."""
    names = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    out = []
    for path in (ROOT / n for n in names if n.endswith(".json")):
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if path.name.startswith("calibration_fit") and "per_head" in rec:
            out.append((path, "fit"))
        elif isinstance(rec, dict) and rec.get("kind") == "matched" and "metrics" in rec:
            out.append((path, "matched"))
    return out


def test_a_matched_record_holds_its_reach_rule(tmp_path):
    from harness_util import run_inprocess

    from experiments.matched import REACH_SPARSITY

    rec = run_inprocess(["experiment=calibration_check_default", "dry_run=true"], tmp_path)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["metrics"]["reach_sparsity"] == REACH_SPARSITY


def test_the_committed_records_hold_the_rules():
    from eval.calibrate import BOUNDS, STATS
    from experiments.matched import REACH_SPARSITY

    found = {"fit": 0, "matched": 0}
    for path, kind in _committed_rule_records():
        rec = json.loads(path.read_text())
        found[kind] += 1
        if kind == "fit":
            assert rec["stats"] == list(STATS), path
            assert rec["bounds"] == {k: list(v) for k, v in BOUNDS.items()}, path
        else:
            assert rec["metrics"]["reach_sparsity"] == REACH_SPARSITY, path
    assert found["fit"] >= 3 and found["matched"] >= 18, found
