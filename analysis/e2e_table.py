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

from analysis.records import device_label

COLUMNS = (
    ("config", "label", None), ("L", "L", None), ("density", "density", ".3f"),
    ("estimate ms", "estimate_ms", ".1f"), ("sparse attn ms", "sparse_attention_ms", ".1f"),
    ("dense attn ms", "dense_attention_ms", ".1f"), ("rest ms", "rest_ms", ".1f"),
    ("total ms", "total_ms", ".1f"), ("vs flash", "speedup_vs_flash", ".2f"),
    ("vs cuDNN", "speedup_vs_cudnn", ".2f"), ("bound vs flash", "attention_bound_vs_flash", ".2f"),
)  # fmt: skip


def _cell(row: dict, key: str, spec: str | None) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def table(rec: dict, path: str) -> str:
    """A markdown table of one e2e record, with a line naming its source and environment."""
    env, m = rec["environment"], rec["metrics"]
    lines = [
        f"`{path}`: {m['model']}, {m['text']}, {m['dtype']}, {device_label(env)}, torch "
        f"{env['torch']}, Triton {env['triton']}, git {str(env['git_revision'])[:7]}",
        "",
        "| " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    rows = sorted(m["rows"], key=lambda r: (r["L"], r["label"] not in ("full_flash", "full_cudnn")))
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['L']} | {r['error']} |" + " |" * (len(COLUMNS) - 3))
            continue
        lines.append("| " + " | ".join(_cell(r, key, spec) for _, key, spec in COLUMNS) + " |")
    return "\n".join(lines)


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
