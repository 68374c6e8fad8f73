"""The two ablation tables (markdown), ours next to the paper's, from records only.

    python analysis/ablation_tables.py [--results results] [--latest] [--out FILE]

Reads the records of experiment=hparams_tau, hparams_S and component_ablation (and their
``scale=gemma3_270m_8k`` and ``scale=gemma3_270m_32k`` runs on real captured attention, records
``<name>_gemma3_270m_8k`` and ``<name>_gemma3_270m_32k``, when pinned)
pinned in ``results/manifest.yaml`` (``--latest``: the newest ok record of each instead) and writes
``outputs/analysis/ablations.md`` (git-ignored). ``python analysis/pin.py`` rebuilds the published
``results/figures/ablations.md``. Rows of sweep points reused from other code or data
(``reuse_stale=true``) are marked "(stale)".
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.records import SCRATCH, describe, experiment_commands, paper_numbers, record_for
from analysis.tables import markdown

HPARAMS = ("hparams_tau", "hparams_S")
COMPONENT = "component_ablation"
# (column, the record's metric, format), in table order
METRICS = (("sparsity", "sparsity", ".3f"), ("MAE", "mae", ".5f"), ("MSE", "mse", ".3e"))


def _formats(paper: bool) -> dict[str, str]:
    """Column -> format, in table order: each quantity ours, then the paper's when ``paper``."""
    sides = ("ours", "paper") if paper else ("ours",)
    return {f"{col} ({side})": fmt for col, _, fmt in METRICS for side in sides}


def _ours_and_paper(m: dict, p: tuple | None) -> dict:
    """``sparsity / MAE / MSE (ours)``, each followed by the paper's when ``p`` is given."""
    out = {}
    for i, (col, key, _) in enumerate(METRICS):
        out[f"{col} (ours)"] = m[key]
        if p is not None:
            out[f"{col} (paper)"] = p[i]
    return out


def _stale(pt: dict) -> str:
    return " (stale)" if pt.get("stale") else ""


def hparams_table(
    results: Path, use_latest: bool = False, names=HPARAMS, paper: bool = True
) -> str:
    """S and tau rows of the ``names`` sweeps; ``paper``: the paper's row at the same (S, tau)
    beside ours (leave it out for records of other shapes, whose S the paper has not)."""
    numbers = {(r[0], r[1]): r[2:] for r in paper_numbers()["hparams"]["rows"]}
    rows, sources = [], []
    for name in names:
        rec = record_for(results, name, use_latest)
        if rec is None:
            rows.append({"S": f"(no ok record of {experiment_commands()[name]})"})
            continue
        sources.append(describe(rec))
        for pt in rec["metrics"]["points"]:
            if pt["status"] != "ok":
                continue
            pcfg = _point_cfg(rec, pt)
            S, tau = pcfg["S"], pcfg["tau"]
            p = numbers.get((S, round(tau, 6)), (None, None, None)) if paper else None
            rows.append(
                {
                    "S": f"{S}{_stale(pt)}",
                    "tau": format(tau, "g"),
                    **_ours_and_paper(pt["metrics"], p),
                }
            )
    df = pd.DataFrame(rows, columns=["S", "tau", *_formats(paper)])
    return "\n".join([markdown(df, _formats(paper)), ""] + [f"- {s}" for s in sources])


def _point_cfg(rec: dict, pt: dict) -> dict:
    """Top-level S and tau of a sweep point: the experiment's values with the point's overrides."""
    cfg = {"S": rec["config"]["S"], "tau": rec["config"]["tau"]}
    cfg.update({k: v for k, v in pt["set"].items() if k in cfg})
    return cfg


def component_table(
    results: Path, use_latest: bool = False, name: str = COMPONENT, paper: bool = True
) -> str:
    """One row per variant of the ``name`` sweep, the paper's beside ours when ``paper``."""
    numbers = paper_numbers()["component"]["rows"]
    rec = record_for(results, name, use_latest)
    cols = ["variant", *_formats(paper)]
    if rec is None:
        df = pd.DataFrame(
            [{"variant": f"(no ok record of {experiment_commands()[name]})"}], columns=cols
        )
        return markdown(df, _formats(paper))
    rows = [
        {
            "variant": f"{pt['label']}{_stale(pt)}",
            **_ours_and_paper(
                pt["metrics"], numbers.get(pt["label"], (None,) * 3) if paper else None
            ),
        }
        for pt in rec["metrics"]["points"]
        if pt["status"] == "ok"
    ]
    return "\n".join(
        [markdown(pd.DataFrame(rows, columns=cols), _formats(paper)), "", f"- {describe(rec)}"]
    )


# the same ablations on real captured attention: Gemma 3 270M at 8K (CPU reference paths) and at
# 32K, its longest context (GPU kernels); each group: (heading, hparams names, component name)
CAPTURED_GROUPS = (
    (
        "Gemma 3 270M, 8K, CPU reference paths",
        ("hparams_tau_gemma3_270m_8k", "hparams_S_gemma3_270m_8k"),
        "component_ablation_gemma3_270m_8k",
    ),
    (
        "Gemma 3 270M, 32K, GPU kernels",
        ("hparams_tau_gemma3_270m_32k", "hparams_S_gemma3_270m_32k"),
        "component_ablation_gemma3_270m_32k",
    ),
)
CAPTURED = tuple(n for _, hp, comp in CAPTURED_GROUPS for n in (*hp, comp))


def document(results: Path, use_latest: bool = False) -> str:
    """The published ``ablations.md``: the paper's two tables with ours beside them, then the
    same on real captured attention for each of :data:`CAPTURED_GROUPS` with a record."""
    text = (
        "## Hyperparameter ablations (paper: Qwen3-8B, 128K)\n\n"
        + hparams_table(results, use_latest)
        + "\n\n## Component ablation (paper: Qwen3-8B, 128K, one representative head)\n\n"
        + component_table(results, use_latest)
        + "\n"
    )
    for heading, hparams, component in CAPTURED_GROUPS:
        if all(record_for(results, n, use_latest) is None for n in (*hparams, component)):
            continue
        text += (
            f"\n## The same on real attention: {heading} (the paper's numbers are above)\n\n"
            + hparams_table(results, use_latest, names=hparams, paper=False)
            + "\n\n"
            + component_table(results, use_latest, name=component, paper=False)
            + "\n"
        )
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--latest", action="store_true", help="newest ok records, not the pinned ones")
    ap.add_argument("--out", type=Path, default=SCRATCH / "ablations.md")
    args = ap.parse_args(argv)
    text = document(args.results, args.latest)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
