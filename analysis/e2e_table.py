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

from analysis.records import device_label, git_short
from analysis.tables import markdown
from eval.amdahl import amdahl_ms

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
        f"{env['torch']}, Triton {env['triton']}, git {git_short(env)}"
    )
    return head + "\n\n" + markdown(frame(rec), formats)


def random_weights(rec: dict) -> bool:
    m = rec["metrics"]
    return "random" in str(m.get("weights", "")) or "random" in str(m["model"])


def model_label(rec: dict, name: str | None = None) -> str:
    """The model's name (the manifest key, else the record's), RANDOM WEIGHTS in capitals when
    it has them, else the trained weights and the text."""
    name = name or str(rec["metrics"]["model"]).replace(" (random weights)", "")
    if random_weights(rec):
        return f"{name}: RANDOM WEIGHTS"
    return f"{name} (trained weights, {rec['metrics'].get('text')})"


def breakdown(rec: dict) -> pd.DataFrame:
    """The record's rows, with ``attention_ms``: its sparse and dense attention together."""
    df = pd.DataFrame(rec["metrics"]["rows"])
    df["attention_ms"] = df["sparse_attention_ms"] + df["dense_attention_ms"]
    return df


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


# -- time to first token against dense SDPA, with each method's Amdahl bound --------------------

DENSE = ("full_flash", "full_cudnn", "sdpa_stock")
TARGET_SHARE = 0.85  # a sparse method within 15% of its own Amdahl bound (the TTFT targets)


def ttft_frame(recs: list[dict]) -> pd.DataFrame:
    """One row per (length, sparse configuration) of e2e records that hold ``sdpa_stock`` and
    ``full_cudnn`` at that length: the speedup over dense SDPA (the stock model, SDPA's own
    dispatch) and over cuDNN, and the Amdahl bound at the row's own density against dense SDPA:
    ``stock / (rest + density x attention)``, with the rest and the attention of the fastest
    dense kernel (the cuDNN run; estimation counted as free), and the share of it reached."""
    out = []
    for rec in recs:
        rows = {(r["L"], r["label"]): r for r in rec["metrics"]["rows"] if "error" not in r}
        for (L, label), r in sorted(rows.items()):
            stock, cudnn = rows.get((L, "sdpa_stock")), rows.get((L, "full_cudnn"))
            if label in DENSE or stock is None or cudnn is None or r.get("density") is None:
                continue
            bound = stock["total_ms"] / amdahl_ms(cudnn, r["density"])
            speedup = stock["total_ms"] / r["total_ms"]
            out.append({
                "L": L, "config": label, "density": r["density"], "total ms": r["total_ms"],
                "dense SDPA ms": stock["total_ms"], "vs SDPA": speedup,
                "vs cuDNN": cudnn["total_ms"] / r["total_ms"], "Amdahl bound": bound,
                "share of bound": speedup / bound, "estimate ms": r["estimate_ms"],
                "sparse attn ms": r["sparse_attention_ms"], "rest ms": r["rest_ms"],
                "target": "met" if speedup / bound >= TARGET_SHARE and speedup >= 1 else "missed",
            })  # fmt: skip
    order = {"s2o": 0, "flexprefill": 2, "xattn": 3, "pbs": 4, "flashprefill": 5}
    out.sort(key=lambda r: (r["L"], order.get(r["config"].split("_")[0], 6), r["config"]))
    return pd.DataFrame(out)


TTFT_FORMATS = {
    "density": ".3f", "total ms": ".1f", "dense SDPA ms": ".1f", "vs SDPA": ".2f",
    "vs cuDNN": ".2f", "Amdahl bound": ".2f", "share of bound": ".3f", "estimate ms": ".1f",
    "sparse attn ms": ".1f", "rest ms": ".1f",
}  # fmt: skip


def ttft_figure(df: pd.DataFrame, title: str, out: Path) -> str:
    """Speedup over dense SDPA per length and configuration (bars) with each one's Amdahl bound
    at its density (black ticks)."""
    from analysis.plotting import save, setup

    plt = setup()
    lengths = sorted(df["L"].unique())
    configs = list(dict.fromkeys(df["config"]))
    width = 0.8 / len(configs)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for j, name in enumerate(configs):
        sub = df[df["config"] == name].set_index("L").reindex(lengths)
        x = [i + (j - (len(configs) - 1) / 2) * width for i in range(len(lengths))]
        ax.bar(x, sub["vs SDPA"], width, label=name)
        ax.scatter(x, sub["Amdahl bound"], marker="_", s=120, color="black", zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(lengths)), [f"{int(v) // 1024}K" for v in lengths])
    ax.set_ylabel("speedup over dense SDPA (TTFT)")
    ax.set_title(title + " (black: Amdahl bound at each method's density)", fontsize=8)
    ax.legend(fontsize=7, ncol=3)
    return save(fig, out)
