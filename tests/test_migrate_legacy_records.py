"""benchmarks/migrate_legacy_records.py: one old record of each layout (``tests/data/
legacy_records/``, byte copies of committed records before the migration) becomes exactly the
committed migrated record, keeps every measured number where the current scripts put it, and a
second run changes nothing; analysis refuses a record of an old layout by name."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from harness_util import ROOT

from analysis import bench_records as br
from benchmarks import migrate_legacy_records as mig

DATA = ROOT / "tests" / "data" / "legacy_records"
# fixture -> the committed record it was copied from (before the migration)
COMMITTED = {
    "bench_s2o": "results/kernels/run8/cub_311baa7/bench_NVIDIA_H200.json",
    "step1_probe": "results/kernels/run8/step1_probe_07f2549.json",
    "pass2_probe": "results/kernels/run6/pass2_probe.json",
    "bench_baselines": "results/baselines/bench_baselines.json",
}


def _load(name: str) -> tuple[dict, bytes]:
    raw = (DATA / f"{name}.json").read_bytes()
    return json.loads(raw), raw


@pytest.mark.parametrize("name", list(COMMITTED))
def test_migration_reproduces_the_committed_record(name):
    old, raw = _load(name)
    assert mig.legacy_schema(old) == name
    new = mig.migrate(old, raw)
    assert new == json.loads((ROOT / COMMITTED[name]).read_text())
    assert new["migrated_from"] == {"schema": f"legacy {name}",
                                    "sha256": hashlib.sha256(raw).hexdigest()}  # fmt: skip
    assert new["kind"] == "benchmark" and new["benchmark"] == name and new["status"] == "ok"
    env = old.get("env") or old["environment"]
    assert new["environment"]["device_name"] == env["gpu"] == new["identity"]["device_model"]
    assert new["environment"]["git_revision"] == env["git_rev"] == new["identity"]["code"]
    assert new["environment"]["time"] == env.get("date")
    assert new["command"] == old.get("command")
    assert {k: new["environment"][k] for k in ("torch", "triton", "cuda")} == {
        k: env[k] for k in ("torch", "triton", "cuda")
    }


def test_bench_s2o_lengths_keep_every_number():
    old, raw = _load("bench_s2o")
    new = mig.migrate(old, raw)
    assert [x["abcd"] for x in old["lengths"]] == [r["abcd"] for r in new["metrics"]["lengths"]]
    for was, now in zip(old["lengths"], new["metrics"]["lengths"], strict=True):
        assert now["full_ms"] == {"flash": was["flash_ms"], "cudnn": was["cudnn_ms"]}
        assert (now["L"], now["step1_ms"], now["s2o"]) == (was["L"], was["step1_ms"], was["s2o"])
    for key in ("copy_tb_s", "launch", "sweep"):
        assert new["metrics"][key] == old[key], key
    cfg, sh = new["config"], old["shape"]
    assert cfg["segment_len"] == sh["segment_len"] and cfg["block"] == sh["block_m"]
    assert cfg["stop_chunk"] == [old["stop_chunk"]["n"], old["stop_chunk"]["grow"]]
    assert cfg["step1"] == old["step1_config"] and cfg["generator"] == old["generator"]
    assert cfg["shape"] == {"B": 1, "Hq": 32, "Hkv": 8, "D": 128, "dtype": "bfloat16",
                            "device": "cuda"}  # fmt: skip


def test_probes_and_baselines_keep_their_measurements():
    not_measured = {
        "step1_probe": ("env", "L", "S", "shape"),
        "pass2_probe": ("env", "L", "S"),
        "bench_baselines": ("environment", "shape", "input", "command"),
    }
    for name, config_keys in not_measured.items():
        old, raw = _load(name)
        new = mig.migrate(old, raw)
        assert new["metrics"] == {k: v for k, v in old.items() if k not in config_keys}, name
    old, raw = _load("step1_probe")
    assert mig.migrate(old, raw)["config"]["shape"] == dict(
        zip(("B", "Hq", "Hkv", "D"), old["shape"], strict=True), device="cuda"
    )


def test_migration_is_idempotent_and_leaves_other_records_alone(tmp_path):
    results = tmp_path / "results"
    for name in COMMITTED:
        (results / name).mkdir(parents=True)
        shutil.copy(DATA / f"{name}.json", results / name / "old.json")
    current = ROOT / "results/benchmarks/abcd/1c9423a23df0/record.json"
    (results / "benchmarks").mkdir()
    shutil.copy(current, results / "benchmarks" / "record.json")
    first = mig.migrate_tree(results)
    assert sorted(p.parent.name for p in first) == sorted(COMMITTED)
    after = {p: p.read_bytes() for p in results.rglob("*.json")}
    assert after[results / "benchmarks" / "record.json"] == current.read_bytes()
    assert mig.migrate_tree(results) == []
    assert {p: p.read_bytes() for p in results.rglob("*.json")} == after


def test_unknown_old_layout_is_named(tmp_path):
    odd = {"env": {"gpu": "NVIDIA H200", "git_rev": "abc1234"}, "points": [1.0]}
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    with pytest.raises(mig.LegacyError, match=r"odd\.json.*no known layout"):
        mig.migrate_tree(tmp_path)


@pytest.mark.parametrize("name", list(COMMITTED))
def test_analysis_refuses_a_record_of_an_old_layout(name):
    old, _ = _load(name)
    with pytest.raises(br.SchemaError, match="not a benchmark record.*migrate_legacy_records"):
        br.machine(old)
    with pytest.raises(br.SchemaError, match="`kind`"):
        br.abcd_frame(old)
