"""The FlashPrefill faithfulness record (``benchmarks/faithfulness_flashprefill.py``, issue 36) as
a markdown page: one table of block sets (ours against the official code's, per head shape,
length, alpha and our path) and one of outputs. Reads the record only.

    python -m analysis.faithfulness results/benchmarks/faithfulness_flashprefill/<id>/record.json
    python -m analysis.faithfulness <record.json> --write    # faithfulness.md beside it
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from analysis import bench_records as br
from analysis.tables import markdown as md_table

BENCHMARK = "faithfulness_flashprefill"
SHARES = ("same set", "Jaccard mean", "Jaccard min", "density official", "density ours")


def _margin(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def blocks_frame(rec: dict) -> pd.DataFrame:
    """One row per (heads, L, alpha, our path): the per-row block-set agreement."""
    rows = []
    for r in rec["metrics"]["rows"]:
        for impl in rec["config"]["impls"]:
            b = r["blocks"][impl]
            rows.append({
                "heads": r["heads"], "L": r["L"], "alpha": r["alpha"], "ours": impl,
                "rows": b["rows"], "same set": b["exact_share"], "Jaccard mean": b["jaccard_mean"],
                "Jaccard min": b["jaccard_min"], "rows differ": b["rows_differ"],
                "density official": b["density_official"], "density ours": b["density_ours"],
                "only official": b["only_official"], "only ours": b["only_ours"],
                "margin (official scores)": _margin(b["margin_by_official_scores"]),
                "margin (our scores)": _margin(b["margin_by_our_scores"]),
            })  # fmt: skip
    return pd.DataFrame(rows).astype(object)


def outputs_frame(rec: dict) -> pd.DataFrame:
    """One row per (heads, L, alpha): relative errors (``||a - b|| / ||b||``) and max abs."""
    rows = []
    for r in rec["metrics"]["rows"]:
        o = r["outputs"]
        rows.append({
            "heads": r["heads"], "L": r["L"], "alpha": r["alpha"],
            "official vs ours": o["official_vs_ours"]["rel"],
            "max abs": o["official_vs_ours"]["max_abs"],
            "official vs our kernel on its blocks": o["official_vs_ours_on_official_blocks"]["rel"],
            "official vs dense": o["official_vs_dense"]["rel"],
            "ours vs dense": o["ours_vs_dense"]["rel"],
            "dense vs fp32": o["dense_vs_fp32"]["rel"],
            "official NaN": o["official_nan"],
        })  # fmt: skip
    return pd.DataFrame(rows).astype(object)


def exercised(rec: dict) -> str:
    """One generated line: in how many rows the official code dropped any block. Where it keeps
    every block (density 1), equal block sets say nothing about the threshold rule; only the
    outputs (the sparse kernel on a full mask) are compared there."""
    rows = rec["metrics"]["rows"]
    impl = rec["config"]["impls"][0]
    sparse = [r for r in rows if r["blocks"][impl]["density_official"] < 1.0]
    if not sparse:
        return (
            f"**The selection rule was not exercised:** in all {len(rows)} rows the official code "
            f"kept every block (density 1.0 on {br.input_name(rec)}), so the equal block sets "
            "below test no threshold; only the outputs are compared. Rerun on an input where "
            "FlashPrefill drops blocks (`--input calibrated`)."
        )
    return (
        f"The selection rule was exercised in {len(sparse)} of {len(rows)} rows (official "
        f"density below 1.0: {min(r['blocks'][impl]['density_official'] for r in sparse):.3f} "
        f"to {max(r['blocks'][impl]['density_official'] for r in sparse):.3f})."
    )


def markdown(rec: dict) -> str:
    """The page of one record; a :class:`analysis.bench_records.SchemaError` for another kind."""
    if br.benchmark(rec) != BENCHMARK:
        raise br.SchemaError(f"not a {BENCHMARK} record (benchmark {rec['benchmark']!r})")
    cfg, env = rec["config"], rec["environment"]
    off = cfg["official"]
    knobs = ", ".join(f"{k} {v}" for k, v in cfg["knobs"].items())
    short = "; **partial** (cut off)" if br.partial(rec) else ""
    lines = [
        f"# FlashPrefill: ours against the official code{short}",
        "",
        f"{br.machine(rec)['gpu']}, code {env['git_revision']}, {env['time']}; official "
        f"`{off['file']}` sha256 {off['sha256']}, `fla.utils`: {off['fla']}; {cfg['dtype']}, "
        f"head dim {cfg['head_dim']}, {br.input_name(rec)}; {knobs}"
        + ("; the official selection uncompiled (`--eager`)" if cfg.get("eager") else ""),
        "",
        exercised(rec),
        "",
        "Block sets per row (batch, query tile, query head). Density: kept / causal blocks. "
        "Margin: the largest `|score / row max - alpha|` among the blocks the two sides disagree "
        "on.",
        "",
        md_table(blocks_frame(rec), dict.fromkeys(SHARES, ".4f")),
        "",
        "Outputs, relative error `||a - b|| / ||b||` (b: the second name), in the model dtype; "
        "`dense vs fp32` is the yardstick (dense SDPA against fp32).",
        "",
        md_table(outputs_frame(rec), {c: ".2e" for c in outputs_frame(rec).columns[3:-1]}),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--write", action="store_true", help="write faithfulness.md beside it")
    args = ap.parse_args(argv)
    page = markdown(json.loads(args.record.read_text()))
    if args.write:
        (args.record.parent / "faithfulness.md").write_text(page)
    print(page, end="")
    return page


if __name__ == "__main__":
    main()
