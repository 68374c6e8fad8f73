"""The two ablation tables (markdown), ours next to the paper's, from records only.

    python analysis/ablation_tables.py [--results results] [--latest] [--out FILE]

Reads the records of experiment=hparams_tau, hparams_S and component_ablation pinned in
``results/manifest.yaml`` (``--latest``: the newest ok record of each instead) and writes
``outputs/analysis/ablations.md`` (git-ignored). ``python analysis/pin.py`` rebuilds the published
``results/figures/ablations.md``. Rows of sweep points reused from other code or data
(``reuse_stale=true``) are marked "(stale)".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.records import SCRATCH, describe, paper_numbers, record_for


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _stale(pt: dict) -> str:
    return " (stale)" if pt.get("stale") else ""


def hparams_table(results: Path, use_latest: bool = False) -> str:
    paper = {(r[0], r[1]): r[2:] for r in paper_numbers()["hparams"]["rows"]}
    lines = [
        "| S | tau | sparsity (ours) | sparsity (paper) | MAE (ours) | MAE (paper) "
        "| MSE (ours) | MSE (paper) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sources = []
    for name in ("hparams_tau", "hparams_S"):
        rec = record_for(results, name, use_latest)
        if rec is None:
            lines.append(f"| (no ok record of experiment={name}) |||||||")
            continue
        sources.append(describe(rec))
        for pt in rec["metrics"]["points"]:
            if pt["status"] != "ok":
                continue
            pcfg = _point_cfg(rec, pt)
            S, tau = pcfg["S"], pcfg["tau"]
            m = pt["metrics"]
            sp, mae, mse = paper.get((S, round(tau, 6)), (None, None, None))
            lines.append(
                f"| {S}{_stale(pt)} | {tau:g} | {m['sparsity']:.3f} | {_fmt(sp, '.3f')} "
                f"| {m['mae']:.5f} | {_fmt(mae, '.5f')} | {m['mse']:.3e} | {_fmt(mse, '.3e')} |"
            )
    return "\n".join(lines + [""] + [f"- {s}" for s in sources])


def _point_cfg(rec: dict, pt: dict) -> dict:
    """Top-level S and tau of a sweep point: the experiment's values with the point's overrides."""
    cfg = {"S": rec["config"]["S"], "tau": rec["config"]["tau"]}
    cfg.update({k: v for k, v in pt["set"].items() if k in cfg})
    return cfg


def component_table(results: Path, use_latest: bool = False) -> str:
    paper = paper_numbers()["component"]["rows"]
    lines = [
        "| variant | sparsity (ours) | sparsity (paper) | MAE (ours) | MAE (paper) "
        "| MSE (ours) | MSE (paper) |",
        "|---|---|---|---|---|---|---|",
    ]
    rec = record_for(results, "component_ablation", use_latest)
    if rec is None:
        return "\n".join(lines + ["| (no ok record of experiment=component_ablation) ||||||"])
    for pt in rec["metrics"]["points"]:
        if pt["status"] != "ok":
            continue
        m, p = pt["metrics"], paper.get(pt["label"], (None, None, None))
        lines.append(
            f"| {pt['label']}{_stale(pt)} | {m['sparsity']:.3f} | {_fmt(p[0], '.3f')} "
            f"| {m['mae']:.5f} | {_fmt(p[1], '.5f')} | {m['mse']:.3e} | {_fmt(p[2], '.3e')} |"
        )
    return "\n".join(lines + ["", f"- {describe(rec)}"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--latest", action="store_true", help="newest ok records, not the pinned ones")
    ap.add_argument("--out", type=Path, default=SCRATCH / "ablations.md")
    args = ap.parse_args(argv)
    text = (
        "## Hyperparameter ablations (paper: Qwen3-8B, 128K)\n\n"
        + hparams_table(args.results, args.latest)
        + "\n\n## Component ablation (paper: Qwen3-8B, 128K, one representative head)\n\n"
        + component_table(args.results, args.latest) + "\n"
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
