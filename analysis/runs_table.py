"""One table of any run records, pinned or not (a pandas DataFrame): one row per record.

    python -m analysis.runs_table results/runs/s2o                 # every record.json under it
    python -m analysis.runs_table outputs/results --all            # every scalar metric
    python -m analysis.runs_table runs/ other/record.json --csv runs.csv

Each row has the record's kind, method and status, the config keys whose values differ between
the records (dotted, e.g. ``method.tau``), and its metrics: every scalar of ``metrics`` (one level
of nesting flattened, e.g. ``latency.speedup``), and for an accuracy record its cells pooled
(``accuracy`` and ``density`` weighted by each cell's ``n``). Without ``--all`` the table keeps
the :data:`CONFIG` keys and the :data:`HEADLINE` metrics. ``python run.py -m`` ends with such a
table of its points (run.py ``sweep_table``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

# the metrics a table shows without --all, in this order (those some record has)
HEADLINE = ("sparsity", "density", "mse", "latency.speedup", "accuracy", "n_samples",
            "n_points", "n_failed")  # fmt: skip
# the config keys a table shows without --all (those whose values differ between the records)
CONFIG = ("name", "method.", "data.L", "data.source", "model.name", "benchmark.tasks",
          "benchmark.lengths", "benchmark.n", "device", "dtype", "seed")  # fmt: skip
# config keys that say nothing about what was computed (experiments/records.py NOT_IDENTITY)
QUIET = ("wandb", "results_dir", "skip_done", "reuse_stale", "progress", "git_rev", "tiny",
         "input_cache", "method_name")  # fmt: skip


def find(paths: list[Path]) -> list[Path]:
    """The ``record.json`` files named or found (recursively) under folders, in order."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("record.json")) if p.is_dir() else [p]
    return out


def _scalars(tree: dict, prefix: str = "", depth: int = 2) -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth > 1:
            out.update(_scalars(value, f"{name}.", depth - 1))
        elif isinstance(value, bool | int | float | str) or value is None:
            out[name] = value
        elif isinstance(value, list) and all(isinstance(v, int | float | str) for v in value):
            out[name] = ",".join(map(str, value))
    return out


def metrics_of(record: dict) -> dict:
    """A record's scalar metrics, flattened one level; an accuracy record's cells pooled."""
    metrics = record.get("metrics") or {}
    out = {k: v for k, v in _scalars(metrics).items() if not isinstance(v, str)}
    cells = [c for c in metrics.get("cells") or [] if c.get("n")]
    if cells:
        n = sum(c["n"] for c in cells)
        out["accuracy"] = sum(c["accuracy"] * c["n"] for c in cells) / n
        dens = [(c["density"], c["n"]) for c in cells if c.get("density") is not None]
        if dens:
            out["density"] = sum(d * w for d, w in dens) / sum(w for _, w in dens)
    return out


def frame(paths: list[Path], headline: bool = True) -> pd.DataFrame:
    """One row per record under ``paths`` (:func:`find`); see the module docstring."""
    rows, configs = [], []
    for path in find(paths):
        try:
            rec = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            rows.append({"record": str(path), "status": f"unreadable ({type(exc).__name__})"})
            configs.append({})
            continue
        row = {"record": str(path), "kind": rec.get("kind"), "method": rec.get("method"),
               "status": rec.get("status")}  # fmt: skip
        metrics = metrics_of(rec)
        if headline:
            metrics = {k: metrics[k] for k in HEADLINE if k in metrics}
        rows.append({**row, **metrics})
        config = rec.get("config") or {}
        keep = (lambda k: k.split(".")[0] not in QUIET) if not headline else _shown
        configs.append({k: v for k, v in _scalars(config, depth=3).items() if keep(k)})
    varying = _varying(configs)
    df = pd.DataFrame([{**r, **{k: c.get(k) for k in varying}} for r, c in zip(rows, configs)])
    if df.empty:
        return df
    first = ["record", "kind", "method", "status", *varying]
    return df[[c for c in first if c in df] + [c for c in df if c not in first]]


def _shown(key: str) -> bool:
    return any(key == c or (c.endswith(".") and key.startswith(c)) for c in CONFIG)


def _varying(configs: list[dict]) -> list[str]:
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if len({json.dumps(c.get(k)) for c in configs}) > 1]


def text(df: pd.DataFrame) -> str:
    """The frame as aligned plain text (numbers to 4 significant digits, missing as ``-``)."""
    if df.empty:
        return "(no records)"

    def cell(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cols = [[str(c), *map(cell, df[c].tolist())] for c in df.columns]
    widths = [max(map(len, col)) for col in cols]
    lines = ["  ".join(col[i].ljust(w) for col, w in zip(cols, widths)).rstrip()
             for i in range(len(df) + 1)]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m analysis.runs_table", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("paths", nargs="+", type=Path, help="record.json files or folders of them")
    ap.add_argument("--all", action="store_true", help="every config key and scalar metric")
    ap.add_argument("--csv", type=Path, help="also write the table as CSV")
    a = ap.parse_args(argv)
    df = frame(a.paths, headline=not a.all)
    print(text(df))
    if a.csv:
        df.to_csv(a.csv, index=False)


if __name__ == "__main__":
    main()
