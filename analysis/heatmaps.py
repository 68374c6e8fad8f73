"""Paper Fig. 2 and the appendix heatmaps, from attention-map records
(``experiments/attention_maps.py``).

    python analysis/heatmaps.py results/captures/heatmaps_smollm2_135m_L4096.json [--out FILE]

A record holds, per (layer, head), four views of the causal softmax (original, PBS's key
permutation, S2O without ``Q_perm``, S2O) mean-pooled and quantized (log10), plus the fraction of
prefix tiles that hold 90% / 99% of the prefix mass. This script draws and tabulates them; it
computes nothing from tensors. ``make_all`` calls :func:`section` for the records pinned under
``records.heatmaps`` in ``results/manifest.yaml``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.plotting import save, setup
from analysis.records import SCRATCH
from analysis.sections import Section
from analysis.tables import markdown

VIEWS = {
    "original": "(a) original",
    "pbs": "(b) PBS (local K/V perm.)",
    "s2o_no_qperm": "(c) S2O w/o Q_perm",
    "s2o": "(d) S2O",
}
MASKED = 255


def load(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    rec = json.loads(Path(path).read_text())
    with np.load(Path(path).with_name(rec["maps"])) as z:
        maps = {k: z[k] for k in z.files}
    return rec, maps


def decode(q: np.ndarray, lo: float) -> np.ndarray:
    """uint8 -> log10 probability (NaN where masked)."""
    x = lo + q.astype(np.float64) / 254.0 * -lo
    return np.where(q == MASKED, np.nan, x)


def describe_input(rec: dict) -> str:
    i = rec["input"]
    if "model" in i:
        return f"{i['model']} (real weights), text {i['text']}, L={i['L']}"
    return f"SYNTHETIC ({i['synthetic']}), L={i['L']}"


def plot(rec: dict, maps: dict, out: Path) -> str:
    plt = setup()
    entries = rec["entries"]
    lo = rec["log10_range"][0]
    n = len(entries)
    fig, axes = plt.subplots(n, 4, figsize=(8.0, 2.05 * n + 0.6), squeeze=False)
    fig.subplots_adjust(
        left=0.08, right=0.9, top=1 - 0.55 / (2.05 * n + 0.6), bottom=0.02, wspace=0.05, hspace=0.22
    )
    for r, e in enumerate(entries):
        for c, (view, title) in enumerate(VIEWS.items()):
            ax = axes[r, c]
            im = ax.imshow(decode(maps[f"{e['key']}/{view}"], lo), cmap="magma", vmin=lo, vmax=0)
            if r == 0:
                ax.set_title(title, fontsize=7)
            frac = e["tiles_for_mass"][view]["0.9"]
            ax.set_xlabel(f"90% of prefix mass: {frac:.1%} of tiles", fontsize=6, labelpad=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r, 0].set_ylabel(f"layer {e['layer']}, head {e['head']}", fontsize=7)
    cax = fig.add_axes((0.92, 0.3, 0.015, 0.4))
    fig.colorbar(im, cax=cax, label="log10 mean probability per cell")
    fig.suptitle(f"{describe_input(rec)}; S2O segment S={rec['S']}", fontsize=8)
    return save(fig, out)


def table(rec: dict) -> pd.DataFrame:
    rows = []
    for e in rec["entries"]:
        row = {"layer": e["layer"], "head": e["head"], "prefix mass": e["prefix_mass"]}
        for view in VIEWS:
            row[f"{view} 90%"] = e["tiles_for_mass"][view]["0.9"]
        for view in VIEWS:
            row[f"{view} 99%"] = e["tiles_for_mass"][view]["0.99"]
        rows.append(row)
    return pd.DataFrame(rows)


def section(ctx) -> Section:
    sec = Section(
        "fig2",
        "Fig. 2 and the appendix heatmaps: attention under each permutation",
        "Fig. 2 and appendix Figs. (Llama-3.1-8B, Qwen3-8B heatmaps; qualitative)",
    )
    paths = (ctx.manifest.get("records") or {}).get("heatmaps") or []
    found = [p for p in paths if (ctx.results / p).is_file()]
    if not found:
        sec.missing_line(
            "attention-map records (records.heatmaps)",
            "`python -m experiments.attention_maps --model smollm2_135m --L 4096 --layers "
            "0 15 29 --heads 0 4 --S 1024 --out results/captures/heatmaps_smollm2_"
            "135m_L4096` (CPU, about 2 minutes)",
        )
        return sec
    fmt = {c: ".3f" for c in ("prefix mass",)}
    fmt.update({f"{v} {p}": ".3f" for v in VIEWS for p in ("90%", "99%")})
    for p in found:
        rec, maps = load(ctx.results / p)
        name = Path(p).stem + ".png"
        sec.files.append(plot(rec, maps, ctx.out / name))
        sec.sources.append(
            f"`results/{p}` and its `.npz`: {describe_input(rec)}, S={rec['S']}, "
            f"git {rec.get('git_revision')}; made by `{rec['command']}`"
        )
        sec.body += [
            f"**{describe_input(rec)}**, S={rec['S']}: fraction of the {rec['tile']}x"
            f"{rec['tile']} prefix tiles holding 90% / 99% of the prefix mass (lower = "
            "more concentrated):",
            "",
            markdown(table(rec), fmt),
            "",
        ]
    sec.body += [
        "`prefix mass`: the share of all attention mass that lies in the ranked prefixes (rows "
        "of segment n >= 1, keys before the segment); the rest is in the own segments, which "
        "every method computes densely. Views: (b) keys sorted by importance inside each 256-key "
        "segment (PBS, block 128); (c) each segment's prefix keys in S2O's `KV_perm` order, "
        "queries in token order; (d) the same with each segment's queries in `Q_perm` order "
        "(the own segment's keys stay in token order, so its diagonal scatters: Pass-1 "
        "computes it densely either way).",
        "Paper: heatmaps only, no numbers (Llama-3.1-8B and Qwen3-8B at long context). "
        "**Differs:** our maps are of small models (SmolLM2-135M, Gemma 3 270M) or the synthetic "
        "generator at L=4096, "
        "S=1024, downsampled by mean pooling; they are not stand-ins for the 8B models' maps.",
    ]
    return sec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("record", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rec, maps = load(args.record)
    print(plot(rec, maps, args.out or SCRATCH / f"{args.record.stem}.png"))
    print(markdown(table(rec), {}))


if __name__ == "__main__":
    main()
