"""The hyperparameter and component ablations, from the records pinned for the experiments of
``analysis/ablation_tables.py`` (which writes the tables)."""

from __future__ import annotations

from analysis import ablation_tables
from analysis.inputs import input_label
from analysis.records import device_label, experiment_commands
from analysis.sections import Ctx, Section


def section(ctx: Ctx) -> Section:
    sec = Section(
        "ablations",
        "Hyperparameter and component ablations",
        "Tables: Hyperparameter ablations, Component ablation (Qwen3-8B, 128K)",
    )
    names = (*ablation_tables.HPARAMS, ablation_tables.COMPONENT)
    recs = {n: ctx.experiment(n) for n in (*names, *ablation_tables.CAPTURED)}
    commands = experiment_commands()
    for n, rec in recs.items():
        if rec is None:
            gpu = n in names
            how = f"`python run.py {commands[n]}" + (" data.text=...` (GPU)" if gpu else "` (CPU)")
            sec.missing_line(f"the record of {commands[n]} (experiments.{n})", how)
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
