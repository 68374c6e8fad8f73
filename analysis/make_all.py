"""Every table and figure of the paper, from the committed records, by one command.

    python analysis/make_all.py [--results results] [--out results/figures]

Reads only the records pinned in ``results/manifest.yaml`` (``experiments:`` for the harness's
kind=sweep/matched records, ``records:`` for benchmark, time-to-first-token and capture records),
never recomputes and never modifies a record. Writes every artifact into ``--out`` and one page,
``<out>/README.md``, with each artifact, its source records, the paper's numbers beside ours
(``analysis/paper_numbers.yaml``) and what differs and why. An artifact without records gets a line
naming the missing records and the command that produces them. Deterministic: the same records
give the same bytes (fixed matplotlib settings, no time stamps, no software version in the files).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from analysis import (
    ablation_tables,
    accuracy_tables,
    bench_sections,
    calibration_check,
    fig1,
    fig4a,
    fig4b,
    fig4c,
    fig5_bsa,
    heatmaps,
    loop_speed,
    retrieval_diagnosis,
    ttft,
)
from analysis.inputs import input_label
from analysis.records import HERE, MANIFEST, device_label, paper_numbers
from analysis.sections import Ctx, Section
from analysis.tables import markdown

# ------------------------------------------------------------------------- accuracy tables


# the experiment file whose point list makes each (benchmark, model) table of the pinned records
ACCURACY_EXPERIMENTS = {
    ("ruler", "smollm2_135m"): "accuracy_smollm2_ruler_4k",
    ("ruler", "gemma3_270m"): "accuracy_gemma3_ruler",
    ("infinitebench", "gemma3_270m"): "accuracy_gemma3_passkey_32k",
    ("ruler", "qwen25_coder_1p5b"): "accuracy_retrieval_qwen_niah",
    ("ruler", "llama31_8b"): "accuracy_paper_ruler",
    ("infinitebench", "llama31_8b"): "accuracy_paper_infinitebench",
    ("longbench_v2", "llama31_8b"): "accuracy_paper_longbench_v2",
}


def accuracy(ctx: Ctx) -> Section:
    sec = Section(
        "accuracy",
        "InfiniteBench, RULER, LongBench v2: accuracy and prefill sparsity",
        "Tables: InfiniteBench, RULER (appendix), LongBench v2 (appendix)",
    )
    paths = (ctx.manifest.get("records") or {}).get("accuracy") or []
    found = [ctx.results / p for p in paths if (ctx.results / p).is_file()]
    if found:
        by = accuracy_tables.groups([accuracy_tables.load(p) for p in found])
        recs_all = [r for rs in by.values() for r in rs]
        models = sorted({r["config"]["model"]["name"] for r in recs_all})
        devices = sorted({device_label(r["environment"]) for r in recs_all})
        ns = [c["n"] for r in recs_all for c in r["metrics"]["cells"]]
        others = [m for m in models if m not in accuracy_tables.PAPER_MODELS]
        if others:
            sec.body.append(
                f"**Differs:** models {', '.join(others)}, not the paper's "
                f"{' and '.join(accuracy_tables.PAPER_MODELS.values())}: their accuracies say how "
                "the methods behave inside these models, not what the paper's models do. "
                f"{min(ns)} to {max(ns)} samples per task and length. "
                f"Measured on {'; '.join(devices)}."
            )
            sec.body.append("")
        sec.body.append(
            "Per benchmark and model: the cell pooled over its tasks per length here, every task's "
            "table in the file named under it, accuracy against density (one series per "
            "method and setting of its other knobs, the points its main knob's values), and "
            "accuracy against operator error (rel. MSE), with Spearman's rho per task: how far "
            "a lower MSE means a higher accuracy on these samples."
        )
        for (bench, model), recs in by.items():
            if not any(r["method"] == "flashprefill" for r in recs):
                exp = ACCURACY_EXPERIMENTS.get((bench, model))
                how = (f"`python run.py -m experiment={exp}` (GPU; its flashprefill points)" if exp
                       else f"`python run.py kind=accuracy benchmark={bench} model={model} "
                       "method=flashprefill` (GPU)")  # fmt: skip
                sec.missing_line(f"flashprefill's kind=accuracy records of {bench}, {model}", how)
            stem = f"accuracy_{bench}_{model}"
            (ctx.out / f"{stem}.md").write_text(accuracy_tables.tables(recs))
            accuracy_tables.figure(recs, ctx.out / f"{stem}.png")
            sec.files += [f"{stem}.md", f"{stem}.png"]
            if accuracy_tables.error_figure(recs, ctx.out / f"{stem}_vs_error.png"):
                sec.files.append(f"{stem}_vs_error.png")
            pooled = accuracy_tables.tables(recs, only={"all"}, level=3)
            sec.body += ["", pooled, f"Every task: [`{stem}.md`]({stem}.md).", ""]
        sec.sources += [f"`results/{p}`" for p in paths]
    else:
        sec.missing_line(
            "kind=accuracy records (records.accuracy: a list of record.json paths)",
            "`python run.py kind=accuracy benchmark=ruler model=<model> method=<method>` (and "
            "`benchmark=infinitebench`, `benchmark=longbench_v2`; GPU; the paper's tables need "
            "trained Llama-3.1-8B / Qwen3-8B weights), then `python analysis/accuracy_tables.py`",
        )
    acc = ctx.paper["accuracy"]
    rows = []
    for model, per in acc["infinitebench"]["models"].items():
        for method, cells in per.items():
            ruler = acc["ruler"]["models"][model][method]
            rows.append(
                {
                    "model": model,
                    "method": method,
                    "InfiniteBench Avg.": cells["Avg."][0],
                    "sparsity": cells["Avg."][1],
                    "RULER 8K": ruler["all@8192"][0],
                    "sparsity 8K": ruler["all@8192"][1],
                    "RULER 128K": ruler["all@131072"][0],
                    "sparsity 128K": ruler["all@131072"][1],
                    "LongBench v2": acc["longbench_v2"]["models"][model][method]["all"][0],
                }
            )
    fmt = {"sparsity": ".4f", "sparsity 8K": ".3f", "sparsity 128K": ".3f"}
    sec.body += [
        "The paper's numbers (accuracy x100 / prefill sparsity; the full tables per task and "
        "length are in `analysis/paper_numbers.yaml`, and `analysis/accuracy_tables.py` puts them "
        "beside ours cell by cell):",
        "",
        markdown(pd.DataFrame(rows), fmt),
    ]
    return sec


# ------------------------------------------------------------------------------- ablations


def ablations(ctx: Ctx) -> Section:
    sec = Section(
        "ablations",
        "Hyperparameter and component ablations",
        "Tables: Hyperparameter ablations, Component ablation (Qwen3-8B, 128K)",
    )
    names = (*ablation_tables.HPARAMS, ablation_tables.COMPONENT)
    recs = {n: ctx.experiment(n) for n in (*names, *ablation_tables.CAPTURED)}
    for n, rec in recs.items():
        if rec is None:
            gpu = n in names
            how = f"`python run.py experiment={n}" + (" data.text=...` (GPU)" if gpu else "` (CPU)")
            sec.missing_line(f"the record of experiment={n} (experiments.{n})", how)
    if all(r is None for r in recs.values()):
        return sec
    sec.sources += [f"`{r['_path']}`" for r in recs.values() if r is not None]
    text = ablation_tables.document(ctx.results)
    (ctx.out / "ablations.md").write_text(text)
    sec.files.append("ablations.md")
    sec.body += [
        text.replace("## ", "### "),
        _ablations_differs(ctx, recs),
    ]
    return sec


def _ablations_differs(ctx: Ctx, recs: dict) -> str:
    """The ablations' note, from the pinned records: what each table ran on, and where."""
    lines = sorted(
        {f"{input_label(ctx, r)} on {device_label(r['environment'])}" for r in recs.values() if r}
    )
    return (
        "**Differs:** the paper ran Qwen3-8B's attention at 128K (one representative head in the "
        "component ablation); ours ran on " + "; ".join(lines) + ", over all heads. The captured "
        "runs are real attention of a 270M model, not Qwen3-8B: their numbers are that model's, "
        "and the paper's rows do not apply to their S and length."
    )


# (the ABCD and retrieval tables: analysis/bench_sections.py; Fig. 5: analysis/fig5_bsa.py)


# ---------------------------------------------------------------------------- the page


SECTIONS = (
    fig1.section,
    heatmaps.section,
    fig4a.section,
    fig4b.section,
    fig4c.section,
    ttft.section,
    accuracy,
    retrieval_diagnosis.section,
    loop_speed.section,
    ablations,
    bench_sections.abcd,
    fig5_bsa.section,
    bench_sections.retrieval,
    calibration_check.section,
)

HEAD = """\
# The paper's tables and figures, ours beside the paper's

Generated by `python analysis/make_all.py` from the records pinned in `results/manifest.yaml`
(never recomputed; do not edit this file by hand: rerun the command). Every number of ours below
comes from a record named under its artifact; the paper's numbers are typed in from the paper's
text (`analysis/paper_numbers.yaml`, with the table or figure each comes from). The paper measured
trained Llama-3.1-8B / Qwen3-8B on an A100; none of our records has trained 8B weights, so every
artifact says which GPU, model (or random weights) and input (real captured attention of a small
model, or synthetic) it used.
"""


# The GPU commands that would replace or complete the artifacts (kept as markdown: long table rows).
GPU_RUNS = HERE / "gpu_runs.md"


def render(sections: list[Section]) -> str:
    idx = pd.DataFrame(
        [
            {
                "artifact": f"[{s.title}](#{s.slug})",
                "paper": s.paper,
                "status": ("produced" + (", partly" if s.missing else ""))
                if s.sources
                else "missing records",
                "files": ", ".join(f"`{f}`" for f in s.files) or "-",
            }
            for s in sections
        ]
    )
    parts = [HEAD, markdown(idx), ""]
    for s in sections:
        parts += [f'<a id="{s.slug}"></a>', f"## {s.title}", "", f"Paper: {s.paper}.", ""]
        parts += [f"![{f}]({f})\n" for f in s.files if f.endswith(".png")]
        listed = [f"- {x}" for x in s.sources]
        if len(listed) > 12:  # a long list (the accuracy records) folds away
            parts += [f"<details><summary>Source records ({len(listed)})</summary>", "", *listed,
                      "", "</details>", ""]  # fmt: skip
        elif listed:
            parts += ["Source records:", "", *listed, ""]
        parts += s.body + [""] if s.body else []
        parts += [f"{m}\n" for m in s.missing]
    parts.append(GPU_RUNS.read_text())
    return "\n".join(parts).rstrip() + "\n"


def _build(make: Callable[[Ctx], Section], ctx: Ctx) -> Section:
    """One artifact; a record that cannot be read becomes a line on the page, not a failure."""
    try:
        return make(ctx)
    except (KeyError, ValueError, TypeError, OSError, IndexError, StopIteration) as exc:
        name = make.__module__.split(".")[-1] if make.__name__ == "section" else make.__name__
        sec = Section(name, f"{name}: its records could not be read", "-")
        sec.missing_line(
            f"usable records ({type(exc).__name__}: {exc})",
            "see the section's records in results/manifest.yaml",
        )
        return sec


def main(argv: list[str] | None = None) -> list[Section]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--out", type=Path, default=None, help="default: <results>/figures")
    args = ap.parse_args(argv)
    out = args.out or args.results / "figures"
    out.mkdir(parents=True, exist_ok=True)
    mpath = args.results / MANIFEST
    manifest = yaml.safe_load(mpath.read_text()) if mpath.is_file() else {}
    ctx = Ctx(args.results, out, manifest or {}, paper_numbers())
    sections = [_build(make, ctx) for make in SECTIONS]
    (out / "README.md").write_text(render(sections))
    for s in sections:
        print(
            f"{s.slug}: {', '.join(s.files) or '-'}" + (" (missing records)" if s.missing else "")
        )
    return sections


if __name__ == "__main__":
    main()
