"""Benchmark records -> pandas DataFrames, for every schema they were written in.

Records of ``benchmarks/`` since the consolidation have the harness's schema (``kind:
benchmark``, ``benchmark``, ``environment``, ``config``, ``metrics``). The older committed ones
(history, never rewritten) have three: ``bench_s2o`` (``env``, ``lengths``, ``abcd``), the Step-1
probe (``env``, ``by_L``) and ``bench_baselines`` (``environment`` with ``gpu``/``git_rev``,
``methods``, ``kernel``). Each function here takes any of them and returns the same columns, so
the tables never look at a schema.
"""

from __future__ import annotations

import pandas as pd

from analysis.records import device_label

ABCD = ("A", "B", "C", "D", "D_discard")


class SchemaError(ValueError):
    """A record that has none of the fields a table needs (named in the message)."""


def benchmark(rec: dict) -> str | None:
    """The benchmark that wrote ``rec`` (new schema), else a name guessed from its fields."""
    if rec.get("kind") == "benchmark":
        return rec["benchmark"]
    if "by_L" in rec or "by_S" in rec:
        return "step1_probe"
    if "lengths" in rec and "env" in rec:
        return "bench_s2o"
    if "methods" in rec and "kernel" in rec:
        return "bench_baselines"
    return None


def partial(rec: dict) -> bool:
    """A benchmark record written before its run ended (cut off: only the lengths it reached)."""
    return rec.get("kind") == "benchmark" and rec.get("status") != "ok"


def machine(rec: dict) -> dict:
    """``{"gpu", "git", "date"}`` of any benchmark record."""
    if rec.get("kind") == "benchmark":
        env = rec["environment"]
        return {"gpu": device_label(env), "git": env["git_revision"], "date": env["time"]}
    env = rec.get("env") or rec.get("environment")
    if not env or "gpu" not in env:
        raise SchemaError("no environment in the record (neither `environment` nor `env`)")
    return {"gpu": env["gpu"], "git": env["git_rev"], "date": env.get("date")}


def input_name(rec: dict) -> str:
    """Which Q/K/V the record measured."""
    if rec.get("kind") == "benchmark":
        return f"eval/synthetic.py, --input {rec['config']['input']}, seed {rec['config']['seed']}"
    if "generator" in rec:
        return "bench_s2o's former structured synthetic Q/K/V"
    return str(rec.get("input", "not recorded"))


def length_label(L: int) -> str:
    """``131072`` -> ``128K``; lengths under 1K (smoke runs) as they are."""
    return f"{L // 1024}K" if L >= 1024 else str(L)


def shape(rec: dict) -> dict:
    """``{"Hq", "Hkv", "D"}`` of the inputs."""
    sh = rec["config"]["shape"] if rec.get("kind") == "benchmark" else rec["shape"]
    return {"Hq": sh["Hq"], "Hkv": sh["Hkv"], "D": sh["D"]}


def abcd_frame(rec: dict) -> pd.DataFrame:
    """``L, causal, A, B, C, D, D_discard`` (ms) from an ``abcd`` or ``bench_s2o`` record."""
    name = benchmark(rec)
    if name == "abcd":
        rows = rec["metrics"]["rows"]
    elif name == "bench_s2o" and rec.get("kind") == "benchmark":
        rows = [{"L": x["L"], "causal": True, **x["abcd"]} for x in rec["metrics"]["lengths"]
                if "abcd" in x]  # fmt: skip
    elif name == "bench_s2o":
        rows = rec.get("abcd") or [{"L": x["L"], **x["abcd"]} for x in rec["lengths"]
                                   if "abcd" in x]  # fmt: skip
        rows = [{"causal": True, **r} for r in rows]
    else:
        raise SchemaError(f"not an ABCD record (benchmark {name!r})")
    if not rows:
        raise SchemaError(f"the {name} record has no ABCD rows")
    df = pd.DataFrame(rows)
    return df[["L", "causal", *(c for c in ABCD if c in df)]].sort_values(["causal", "L"])


def step1_frame(rec: dict) -> pd.DataFrame:
    """``L, S, sort_mode, ms, host_ms``: Step 1 with the library's default key scores, from a
    ``retrieval_latency`` record or the old Step-1 probe's ``by_L``."""
    name = benchmark(rec)
    if name == "retrieval_latency":
        df = pd.DataFrame(rec["metrics"]["rows"])
    elif name == "step1_probe" and rec.get("by_L"):
        df = pd.DataFrame(rec["by_L"])
        df = df[df["scores"] == "default"].drop(columns="scores")
    else:
        raise SchemaError(f"no Step-1 rows by (L, S) in the record (benchmark {name!r})")
    return df[["L", "S", "sort_mode", "ms", "host_ms"]].reset_index(drop=True)


def flash_frame(rec: dict | None) -> pd.DataFrame:
    """``L, flash_ms``: SDPA flash (the harness's Full) per length, from a ``retrieval_latency``
    or ``bench_s2o`` record of either schema; empty without one."""
    name = benchmark(rec) if rec else None
    if name == "retrieval_latency":
        rows = [{"L": x["L"], "flash_ms": x["ms"]} for x in rec["metrics"]["flash"]
                if x["backend"] == "flash"]  # fmt: skip
    elif name == "bench_s2o" and rec.get("kind") == "benchmark":
        rows = [{"L": x["L"], "flash_ms": x["full_ms"].get("flash")}
                for x in rec["metrics"]["lengths"]]  # fmt: skip
    elif name == "bench_s2o":
        rows = [{"L": x["L"], "flash_ms": x["flash_ms"]} for x in rec["lengths"]]
    else:
        rows = []
    return pd.DataFrame(rows, columns=["L", "flash_ms"])
