"""InfiniteBench, RULER and LongBench v2: accuracy and prefill sparsity per benchmark and model,
from the kind=accuracy records listed under ``records.accuracy`` (tables and figures:
``analysis/accuracy_tables.py``), and the paper's numbers beside them."""

from __future__ import annotations

import pandas as pd

from analysis import accuracy_summary, accuracy_tables
from analysis.records import device_label
from analysis.sections import Ctx, Section
from analysis.tables import markdown

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


def section(ctx: Ctx) -> Section:
    sec = Section(
        "accuracy",
        "InfiniteBench, RULER, LongBench v2: accuracy and prefill sparsity",
        "Tables: InfiniteBench, RULER (appendix), LongBench v2 (appendix)",
    )
    accuracy_tables.forget()  # each build computes its intervals and comparisons afresh
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
            if accuracy_summary.figure(recs, ctx.out / f"{stem}_summary.png"):
                sec.files.append(f"{stem}_summary.png")
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
