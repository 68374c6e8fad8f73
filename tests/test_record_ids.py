"""Every committed record's identity still follows from what the record stores: its folder name is
its id, the id is the hash of its parts, and its config_id is the hash of its stored config
without its kind's drop table. A refactor of the identity code (docs/architecture.md, step 0)
that changed a committed id, or a record edited by hand, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments import records as common

RESULTS = Path(__file__).resolve().parents[1] / "results"
# Made at e6ed293 (2026-11-23), before kind=e2e left tau/S/sweep/matched/benchmark out of its
# identity: their config_id is the config without NOT_IDENTITY alone.
LEGACY_E2E = {
    "e2e/gemma3_270m/s2o/a4a3577b688d/record.json",
    "e2e/smollm2_135m/s2o/a0756cbedcc0/record.json",
}


def _records() -> list[Path]:
    out = []
    for p in sorted(RESULTS.rglob("record.json")):
        idn = json.loads(p.read_text()).get("identity")
        if isinstance(idn, dict) and "config_id" in idn:
            out.append(p)
    return out


RECORDS = _records()


def test_there_are_records_with_an_identity():
    assert len(RECORDS) > 100, len(RECORDS)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_committed_record_id_follows_from_the_record(path):
    rec = json.loads(path.read_text())
    idn = rec["identity"]
    assert re.fullmatch(r"[0-9a-f]{12}", path.parent.name)
    inputs = [idn["config_id"], idn["code"], idn["data"]]
    for key in ("model", "benchmark_data"):
        if key in idn:
            inputs.append([key, idn[key]])
    assert common._hash(inputs) == idn["id"] == path.parent.name
    cfg = rec["config"]
    legacy = str(path.relative_to(RESULTS)) in LEGACY_E2E
    drop = common.NOT_IDENTITY if legacy else common._drop_for(cfg)
    device = None if idn["device_model"] == "cpu" else idn["device_model"]
    assert common.config_id(cfg, drop, device) == idn["config_id"], (
        f"{path}: config_id {idn['config_id']} is not the hash of the stored config without "
        f"the drop table of kind={cfg.get('kind')}"
    )


BENCHMARKS = sorted((RESULTS / "benchmarks").glob("*/*/record.json"))


def test_there_are_benchmark_records():
    assert len(BENCHMARKS) >= 5, BENCHMARKS


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_benchmark_record_id_is_its_hash(path):
    """A kernel benchmark's folder is its id, and the id is records.benchmark_id of its stored
    config, code revision and GPU model (what benchmarks/common.py's Recorder computes)."""
    rec = json.loads(path.read_text())
    idn = rec["identity"]
    assert rec["id"] == idn["id"] == path.parent.name
    assert path.parent.parent.name == rec["benchmark"]
    assert common.benchmark_id(rec["config"], idn["code"], idn["device_model"]) == rec["id"]
    assert common.benchmark_record_path(RESULTS / "benchmarks", rec["benchmark"], rec["id"]) == path
