"""The rules analysis needs are in the records (issue 30: analysis reads records only): a
kind=matched record holds its reach rule, a calibration fit record its statistics and bounds;
the committed records hold them too (experiments/migrate_rules_into_records.py)."""

from __future__ import annotations

import json


def test_a_matched_record_holds_its_reach_rule(tmp_path):
    from harness_util import run_inprocess

    from experiments.matched import REACH_SPARSITY

    rec = run_inprocess(["experiment=calibration_check_default", "dry_run=true"], tmp_path)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["metrics"]["reach_sparsity"] == REACH_SPARSITY


def test_the_committed_records_hold_the_rules():
    from eval.calibrate import BOUNDS, STATS
    from experiments.matched import REACH_SPARSITY
    from experiments.migrate_rules_into_records import targets

    found = {"fit": 0, "matched": 0}
    for path, kind in targets():
        rec = json.loads(path.read_text())
        found[kind] += 1
        if kind == "fit":
            assert rec["stats"] == list(STATS), path
            assert rec["bounds"] == {k: list(v) for k, v in BOUNDS.items()}, path
        else:
            assert rec["metrics"]["reach_sparsity"] == REACH_SPARSITY, path
    assert found["fit"] >= 3 and found["matched"] >= 18, found
