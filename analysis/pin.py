"""Pin the records behind the published tables and figures, and rebuild them from the pins.

    python analysis/pin.py                  # rebuild results/figures/ from the pinned records
    python analysis/pin.py --latest         # re-pin: the newest ok record of every experiment
    python analysis/pin.py hparams_tau=experiments/hparams_tau/<id>/record.json   # re-pin one

The pins live in ``results/manifest.yaml`` (paths relative to ``--results``). This is the one
analysis command that writes tracked files: the manifest (when re-pinning) and
``results/figures/ablations.md`` and ``results/figures/fig4a_mse_vs_sparsity.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from analysis import ablation_tables, plot_mse_vs_sparsity
from analysis.records import MANIFEST, latest

EXPERIMENTS = ("hparams_tau", "hparams_S", "component_ablation", "fig4a_mse_vs_sparsity")
HEADER = """\
# The records behind the published tables and figures in results/figures/ (paths relative to
# results/). The analysis scripts read these records, never "the newest record": running an
# experiment, a dry run or an analysis script changes no published file. Re-pin explicitly:
#   python analysis/pin.py --latest            # the newest ok record of each experiment
#   python analysis/pin.py hparams_tau=experiments/hparams_tau/<id>/record.json
# pin.py rewrites this file and rebuilds results/figures/ablations.md and fig4a_mse_vs_sparsity.png.
"""


def repin(results: Path, pins: dict, use_latest: bool, assignments: list[str]) -> dict:
    """New pins: the newest ok records (``use_latest``) and/or ``NAME=PATH`` assignments."""
    pins = dict(pins)
    if use_latest:
        for name in EXPERIMENTS:
            rec = latest(results, name)
            if rec is not None:
                pins[name] = str(Path(rec["_path"]).relative_to(results))
    for item in assignments:
        name, sep, rel = item.partition("=")
        if not sep or name not in EXPERIMENTS:
            raise SystemExit(f"expected NAME=PATH, NAME one of {list(EXPERIMENTS)}; got {item!r}")
        rec = json.loads((results / rel).read_text())
        if rec.get("status") != "ok":
            raise SystemExit(f"{results / rel} has status {rec.get('status')!r}: pin an ok record")
        pins[name] = rel
    return pins


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("pins", nargs="*", help="NAME=PATH (relative to --results) to pin")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--latest", action="store_true", help="pin the newest ok record of each")
    args = ap.parse_args(argv)
    path = args.results / MANIFEST
    current = yaml.safe_load(path.read_text()) if path.is_file() else {}
    pins = (current or {}).get("experiments") or {}
    if args.latest or args.pins:
        pins = repin(args.results, pins, args.latest, args.pins)
        body = yaml.safe_dump({"experiments": pins}, sort_keys=False)
        path.write_text(HEADER + body)
        print(f"pinned: {path}")
    figures = args.results / "figures"
    ablation_tables.main(["--results", str(args.results), "--out", str(figures / "ablations.md")])
    if "fig4a_mse_vs_sparsity" in pins:
        out = figures / "fig4a_mse_vs_sparsity.png"
        plot_mse_vs_sparsity.main(["--results", str(args.results), "--out", str(out)])


if __name__ == "__main__":
    main()
