"""Benchmark records -> pandas DataFrames.

Every benchmark record has the harness's schema (``kind: benchmark``, ``benchmark``,
``environment``, ``config``, ``metrics``): ``benchmarks/`` writes it through
:class:`benchmarks.common.Recorder`, and the records of the former scripts were rewritten in it
once (a one-off migration, gone since; ``git log -- benchmarks/migrate_legacy_records.py``; their
``migrated_from`` names the old layout). A record in any other layout is refused with a
:class:`SchemaError` that names the missing field.
"""

from __future__ import annotations

import pandas as pd

from analysis.records import device_label

ABCD = ("A", "B", "C", "D", "D_discard")
# the ``--input`` names of benchmarks/common.py; a migrated record's ``input`` is a description
NAMED_INPUTS = ("synthetic", "calibrated")


class SchemaError(ValueError):
    """A record that has none of the fields a table needs (named in the message)."""


def benchmark(rec: dict) -> str:
    """The benchmark that wrote ``rec``; a :class:`SchemaError` for a record not in the harness's
    schema (``kind: benchmark``)."""
    if rec.get("kind") != "benchmark":
        old = ", ".join(k for k in ("env", "lengths", "by_L", "by_S", "methods") if k in rec)
        hint = f" (fields of a former layout: {old}; see git show 74cbbc6 for their migration)"
        raise SchemaError(f"not a benchmark record: `kind` is {rec.get('kind')!r}, not "
                          f"'benchmark'{hint if old else ''}")  # fmt: skip
    return rec["benchmark"]


def partial(rec: dict) -> bool:
    """A benchmark record written before its run ended (cut off: only the lengths it reached)."""
    benchmark(rec)
    return rec.get("status") != "ok"


def machine(rec: dict) -> dict:
    """``{"gpu", "git", "date"}`` of a benchmark record."""
    benchmark(rec)
    env = rec["environment"]
    return {"gpu": device_label(env), "git": env["git_revision"], "date": env["time"]}


def input_name(rec: dict) -> str:
    """Which Q/K/V the record measured."""
    benchmark(rec)
    cfg = rec["config"]
    if cfg.get("input") in NAMED_INPUTS:
        return f"eval/synthetic.py, --input {cfg['input']}, seed {cfg['seed']}"
    return str(cfg.get("input", "not recorded"))


def length_label(L: int) -> str:
    """``131072`` -> ``128K``; lengths under 1K (smoke runs) as they are."""
    return f"{L // 1024}K" if L >= 1024 else str(L)


def shape(rec: dict) -> dict:
    """``{"Hq", "Hkv", "D"}`` of the inputs."""
    benchmark(rec)
    sh = rec["config"]["shape"]
    return {"Hq": sh["Hq"], "Hkv": sh["Hkv"], "D": sh["D"]}


def abcd_frame(rec: dict) -> pd.DataFrame:
    """``L, causal, A, B, C, D, D_discard`` (ms) from an ``abcd`` or ``bench_s2o`` record."""
    name = benchmark(rec)
    if name == "abcd":
        rows = rec["metrics"]["rows"]
    elif name == "bench_s2o":
        rows = [{"L": x["L"], "causal": True, **x["abcd"]} for x in rec["metrics"]["lengths"]
                if "abcd" in x]  # fmt: skip
    else:
        raise SchemaError(f"not an ABCD record (benchmark {name!r})")
    if not rows:
        raise SchemaError(f"the {name} record has no ABCD rows")
    df = pd.DataFrame(rows)
    return df[["L", "causal", *(c for c in ABCD if c in df)]].sort_values(["causal", "L"])


def step1_frame(rec: dict) -> pd.DataFrame:
    """``L, S, sort_mode, ms, host_ms``: Step 1 with the library's default key scores, from a
    ``retrieval_latency`` record or the former Step-1 probe's ``by_L``."""
    name = benchmark(rec)
    if name == "retrieval_latency":
        df = pd.DataFrame(rec["metrics"]["rows"])
    elif name == "step1_probe" and rec["metrics"].get("by_L"):
        df = pd.DataFrame(rec["metrics"]["by_L"])
        df = df[df["scores"] == "default"].drop(columns="scores")
    else:
        raise SchemaError(f"no Step-1 rows by (L, S) in the record (benchmark {name!r})")
    return df[["L", "S", "sort_mode", "ms", "host_ms"]].reset_index(drop=True)


def flash_frame(rec: dict | None) -> pd.DataFrame:
    """``L, flash_ms``: SDPA flash (the harness's Full) per length, from a ``retrieval_latency``
    or ``bench_s2o`` record; empty without one."""
    name = benchmark(rec) if rec else None
    if name == "retrieval_latency":
        rows = [{"L": x["L"], "flash_ms": x["ms"]} for x in rec["metrics"]["flash"]
                if x["backend"] == "flash"]  # fmt: skip
    elif name == "bench_s2o":
        rows = [{"L": x["L"], "flash_ms": x["full_ms"].get("flash")}
                for x in rec["metrics"]["lengths"]]  # fmt: skip
    else:
        rows = []
    return pd.DataFrame(rows, columns=["L", "flash_ms"])
