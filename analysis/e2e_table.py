"""Time-to-first-token tables from kind=e2e records (reads records only).

    python analysis/e2e_table.py results/e2e/llama31_8b/s2o/<id>/record.json [...]

One markdown table per record: per length and configuration the prefill time of the whole model,
its breakdown (estimation, sparse attention, dense attention of unselected layers, the rest), the
prefill density, the speedups over SDPA flash and cuDNN, and the attention bound.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from analysis.records import device_label
from analysis.tables import markdown

COLUMNS = (
    ("config", "label", None), ("L", "L", None), ("density", "density", ".3f"),
    ("estimate ms", "estimate_ms", ".1f"), ("sparse attn ms", "sparse_attention_ms", ".1f"),
    ("dense attn ms", "dense_attention_ms", ".1f"), ("rest ms", "rest_ms", ".1f"),
    ("total ms", "total_ms", ".1f"), ("vs flash", "speedup_vs_flash", ".2f"),
    ("vs cuDNN", "speedup_vs_cudnn", ".2f"), ("bound vs flash", "attention_bound_vs_flash", ".2f"),
    ("Amdahl at density", "amdahl_bound_vs_flash", ".2f"),
    ("share of Amdahl", "share_of_amdahl", ".2f"),
)  # fmt: skip


def frame(rec: dict) -> pd.DataFrame:
    """One row per (length, configuration) of an e2e record, dense rows first at each length; a
    configuration that failed has its error in the ``density`` column and nothing else."""
    rows = sorted(
        rec["metrics"]["rows"],
        key=lambda r: (r["L"], r["label"] not in ("full_flash", "full_cudnn")),
    )
    cols = [c[0] for c in COLUMNS]
    out = []
    for r in rows:
        if "error" in r:
            out.append({"config": r["label"], "L": r["L"], "density": r["error"]})
        else:
            out.append({name: r.get(key) for name, key, _ in COLUMNS})
    return pd.DataFrame(out, columns=cols).astype(object)


def table(rec: dict, path: str) -> str:
    """A markdown table of one e2e record, with a line naming its source and environment."""
    env, m = rec["environment"], rec["metrics"]
    formats = {
        name: (lambda v, s=spec: v if isinstance(v, str) else format(v, s))
        for name, _, spec in COLUMNS
        if spec
    }
    head = (
        f"`{path}`: {m['model']}, {m['text']}, {m['dtype']}, {device_label(env)}, torch "
        f"{env['torch']}, Triton {env['triton']}, git {str(env['git_revision'])[:7]}"
    )
    return head + "\n\n" + markdown(frame(rec), formats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", type=Path)
    for path in ap.parse_args().records:
        rec = json.loads(path.read_text())
        if rec.get("status") != "ok":
            raise SystemExit(f"{path}: status {rec.get('status')!r}")
        print(table(rec, str(path)), end="\n\n")


if __name__ == "__main__":
    main()
