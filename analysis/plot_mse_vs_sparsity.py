"""Paper Fig. 4a from records: MSE vs sparsity, one curve per method (log-scale MSE).

    python analysis/plot_mse_vs_sparsity.py [--results results] [--name fig4a_mse_vs_sparsity]
        [--latest] [--out FILE]

Reads the record of the named kind=matched experiment pinned in ``results/manifest.yaml``
(``--latest``: the newest ok record instead); every evaluated knob value is a point; the bisection
results at the target sparsities are marked. Writes ``outputs/analysis/<name>.png`` (git-ignored);
``python analysis/pin.py`` rebuilds the published ``results/figures/<name>.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.plotting import save, setup
from analysis.records import SCRATCH, describe, record_for


def plot(rec: dict, out: Path, what: str | None = None) -> Path:
    """The record's curves; ``what``: the input, for the title (default: the model captured, or
    the data source)."""
    plt = setup()
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for name, r in rec["metrics"]["methods"].items():
        if r["status"] != "ok":
            continue
        pts = [p for p in r["curve"] if p["mse"] > 0]
        line = ax.plot([p["sparsity"] for p in pts], [p["mse"] for p in pts], "o-", ms=3,
                       label=f"{name} ({r['main_knob']})")[0]  # fmt: skip
        hits = [p for p in r["at_sparsity"] if p["mse"] > 0]
        ax.plot([p["sparsity"] for p in hits], [p["mse"] for p in hits], "s", mfc="none",
                color=line.get_color(), ms=8)  # fmt: skip
    ax.plot([], [], "s", mfc="none", color="0.3", ms=8, label="bisected to a target sparsity")
    ax.set_yscale("log")
    ax.set_xlabel("sparsity (1 - processed / dense causal tiles)")
    ax.set_ylabel("MSE vs Full (mean over heads, layers)")
    cfg = rec["config"]
    src = cfg["data"]["source"]
    what = what or (f"{cfg['model']['name']}, captured" if src == "model" else f"{src} input")
    ax.set_title(f"MSE vs sparsity, L={cfg['data']['L']}\n{what}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    save(fig, out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--name", default="fig4a_mse_vs_sparsity")
    ap.add_argument("--latest", action="store_true", help="newest ok record, not the pinned one")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rec = record_for(args.results, args.name, args.latest)
    if rec is None:
        how = "ok record under" if args.latest else "record pinned in results/manifest.yaml for"
        sys.exit(f"no {how} {args.results}/experiments/{args.name}: run the experiment or pin it")
    out = args.out or SCRATCH / f"{args.name}.png"
    print(describe(rec))
    print(plot(rec, out))


if __name__ == "__main__":
    main()
