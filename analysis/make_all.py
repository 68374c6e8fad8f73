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
    fig4c,
    fig5_bsa,
    heatmaps,
    loop_speed,
    plot_mse_vs_sparsity,
    retrieval_diagnosis,
    ttft,
)
from analysis.inputs import calibrated, input_label, mistokenized
from analysis.plotting import save, setup
from analysis.records import HERE, MANIFEST, device_label, paper_numbers, rel_path
from analysis.sections import BASELINES, Ctx, Section, missing_baselines
from analysis.tables import markdown

# ----------------------------------------------------------------------- Fig. 4a, Fig. 4b


# the Fig. 4a records, in order: the paper's shape (128K), then real captured attention (32K, 8K)
FIG4A = (
    (
        "fig4a_mse_vs_sparsity",
        "`python run.py experiment=fig4a_mse_vs_sparsity data.text=...` (GPU)",
    ),
    ("fig4a_gemma3_270m_32k", "`python run.py experiment=fig4a_gemma3_270m_32k` (GPU)"),
    ("fig4a_gemma3_270m_8k", "`python run.py experiment=fig4a_gemma3_270m_8k` (CPU, about 12 min)"),
    ("fig4a_smollm2_135m_8k", "`python run.py experiment=fig4a_smollm2_135m_8k` (CPU)"),
)


def _fig4a_table(rec: dict) -> pd.DataFrame | None:
    """MSE per method at each target sparsity, ``(at x)`` where the method's knob range ended at
    sparsity x instead (more than ``calibration_check.TOL`` away), and the record's best baseline
    over S2O (``experiments.matched.ratios``: only methods that reached the target count)."""
    rows = [
        {"method": name, "target": p["target"], "sparsity": p["sparsity"], "mse": p["mse"]}
        for name, r in rec["metrics"]["methods"].items()
        if r.get("status") == "ok"
        for p in r.get("at_sparsity", [])
    ]
    if not rows:
        return None
    df = pd.DataFrame(rows)
    hit = (df["sparsity"] - df["target"]).abs() <= calibration_check.TOL
    df["cell"] = [
        f"{m:.3e}" + ("" if h else f" (at {sp:.2f})")
        for m, h, sp in zip(df["mse"], hit, df["sparsity"])
    ]
    out = df.pivot(index="target", columns="method", values="cell").reset_index()
    at = (rec["metrics"].get("ratios") or {}).get("mse_at_sparsity") or []
    out["best baseline / S2O"] = out["target"].map({r["target"]: r["ratio"] for r in at})
    return out


def _fig4a_input(ctx: Ctx, rec: dict) -> str:
    """What the record's operator ran on, from its config."""
    data = rec["config"]["data"]
    if data["source"] == "model":
        # data.layers null: the model config's capture_layers
        layers = data.get("layers") or rec["config"]["model"].get("capture_layers")
        return (
            f"{rec['config']['model']['name']}'s captured attention (text {data['text']}, "
            f"layers {layers}, L={data['L']}){mistokenized(rec)}"
        )
    kind = "calibrated synthetic" if calibrated(ctx, data) else "synthetic (uncalibrated knobs)"
    return f"{kind} input (`eval/synthetic.py`), L={data['L']}"


def _fig4a_differs(ctx: Ctx, rec: dict, df: pd.DataFrame | None) -> str:
    """One record's line of the Differs note: its input, device and measured ratio range."""
    ratios = [] if df is None else df["best baseline / S2O"].dropna().tolist()
    got = (
        f"the best baseline's MSE is {min(ratios):.2f}x to {max(ratios):.2f}x S2O's"
        if ratios
        else "no target reached by S2O and a baseline"
    )
    return f"- {input_label(ctx, rec)} on {device_label(rec['environment'])}: {got}."


def fig4a(ctx: Ctx) -> Section:
    sec = Section(
        "fig4a", "Fig. 4a: MSE vs sparsity at matched sparsity", "Fig. 4a (Llama-3.1-8B, 128K)"
    )
    differs = []
    for name, how in FIG4A:
        rec = ctx.experiment(name)
        if rec is None:
            sec.missing_line(f"the kind=matched record of experiment={name}", how)
            continue
        missing_baselines(sec, set(rec["metrics"]["methods"]),
                          f"the kind=matched record of experiment={name}",
                          f"{how}; every method again, one record")  # fmt: skip
        out = ctx.out / f"{name}.png"
        plot_mse_vs_sparsity.plot(rec, out)
        sec.files.append(out.name)
        df = _fig4a_table(rec)
        differs.append(_fig4a_differs(ctx, rec, df))
        fmt = {"best baseline / S2O": ".2f"}
        sec.body += [
            f"**{_fig4a_input(ctx, rec)}**: MSE at each target sparsity (bisection of each "
            "method's main knob; `(at x)`: its knob range ended at sparsity x, left out of the "
            "ratio):",
            "",
            markdown(df, fmt) if df is not None else "(no point at a target sparsity)",
            "",
        ]
        sec.sources.append(
            f"`{rel_path(rec['_path'])}` ({device_label(rec['environment'])}, git "
            f"{rec['environment']['git_revision'][:7]}, {_fig4a_input(ctx, rec)})"
        )
    sec.body += [
        f"Paper: S2O's MSE up to {ctx.paper['claims']['mse_ratio_matched_sparsity']}x lower than "
        f"the best baseline at matched sparsity, {ctx.paper['claims']['density_ratio_matched_mse']}"
        "x lower density at matched MSE (Llama-3.1-8B, 128K, LongBench v2).",
        "**Differs:** each record above is another model, input or GPU than the paper's "
        "(Llama-3.1-8B on LongBench v2 at 128K, A100), and its ratios are its own. The captured "
        "records are small models' real attention; a synthetic input is no model's attention "
        "(the calibration check below says how closely the calibrated one, fitted to a 135M "
        "model's attention at 4K, ranks the methods as real attention does):",
        "",
        *differs,
    ]
    return sec


FIG4B = ("full", "s2o", *BASELINES)


def fig4b(ctx: Ctx) -> Section:
    sec = Section(
        "fig4b",
        "Fig. 4b: attention speedup per method, with sparsity and MSE",
        "Fig. 4b (Llama-3.1-8B, 128K, A100)",
    )
    found = {m: ctx.record(f"fig4b.{m}") for m in FIG4B}
    found = {
        m: rp for m, rp in found.items() if rp[0] is not None and "latency" in rp[0]["metrics"]
    }
    if "s2o" not in found:
        sec.missing_line(
            "kind=operator records with timing of S2O and the baselines on one input "
            "(records.fig4b.<method>)",
            "`python run.py -m experiment=operator_128k data=synthetic_calibrated "
            "method=s2o,full,flexprefill,xattn,pbs,flashprefill` (GPU)",
        )
        return sec
    for m in FIG4B:
        if m not in found:
            sec.missing_line(
                f"the kind=operator record of {m} on the pinned input (records.fig4b.{m})",
                "`python run.py experiment=operator_128k data=synthetic_calibrated "
                f"method={m}` (GPU; with the pinned records' data knobs, then pin it)",
            )
    rows = []
    for m, (rec, path) in found.items():
        lat, met = rec["metrics"]["latency"], rec["metrics"]
        rows.append(
            {
                "method": m,
                "knobs": _knobs(rec),
                "estimate ms": lat["estimate_ms"],
                "attention ms": lat["attention_ms"],
                "total ms": lat["total_ms"],
                "Full ms (same run)": lat["full_ms"],
                "speedup": lat["speedup"],
                "sparsity": met["sparsity"],
                "MSE": met["mse"],
            }
        )
        env = rec["environment"]
        sec.sources.append(
            f"`{path}` ({device_label(env)}, git {env['git_revision'][:7]}, {_data(rec)})"
        )
    df = pd.DataFrame(rows)
    plt = setup()
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    x = list(range(len(df)))
    ax.bar(x, df["attention ms"], color="#08519c", label="attention")
    ax.bar(
        x,
        df["estimate ms"],
        bottom=df["attention ms"],
        color="#9ecae1",
        label="preprocessing (estimation)",
    )
    for i, r in df.iterrows():
        ax.text(
            i,
            r["total ms"] * 1.02,
            f"{r['speedup']:.2f}x\nsparsity {r['sparsity']:.2f}\nMSE {r['MSE']:.1e}",
            ha="center",
            fontsize=6,
        )
    ax.set_xticks(x, df["method"].tolist())
    rec0 = found["s2o"][0]
    ax.set_ylabel(f"ms, one layer, L={rec0['config']['data']['L']}")
    ax.set_ylim(0, df["total ms"].max() * 1.35)
    cal = "CALIBRATED " if calibrated(ctx, rec0["config"]["data"]) else ""
    ax.set_title(f"{cal}{_data(rec0)}, {device_label(rec0['environment'])}", fontsize=7)
    ax.legend(fontsize=6, loc="upper right")
    sec.files.append(save(fig, ctx.out / "fig4b_attention_speedup.png"))
    fmt = {
        "estimate ms": ".1f",
        "attention ms": ".1f",
        "total ms": ".1f",
        "Full ms (same run)": ".1f",
        "speedup": ".2f",
        "sparsity": ".3f",
        "MSE": ".2e",
    }
    sec.body += [
        markdown(df, fmt),
        "",
        f"Each method at its default knobs; speedup = Full (SDPA flash) / (estimation + "
        "attention), both timed in the same run. Paper: "
        f"{ctx.paper['claims']['attention_speedup_128k']}x attention speedup of S2O at 128K "
        "(Llama-3.1-8B, A100); the per-method bars are not in the paper's text.",
        _flashprefill_paper(ctx, int(rec0["config"]["data"]["L"])),
        _fig4b_differs(ctx, rec0, df),
    ]
    return sec


def _flashprefill_paper(ctx: Ctx, L: int) -> str:
    """FlashPrefill's own paper's speedups (not S2O's paper), beside a row only at its lengths."""
    fp = ctx.paper["flashprefill_paper"]
    said = ", ".join(f"{v}x at {int(k) // 1024}K" for k, v in fp["speedup"].items())
    if L in fp["speedup"]:
        where = f"at this figure's L={L}: {fp['speedup'][L]}x"
    else:
        where = f"no number at this figure's L={L}, so none stands beside a row"
    return f"FlashPrefill's paper (not S2O's; {fp['cite']}): {said}; {where}."


def _fig4b_differs(ctx: Ctx, rec0: dict, df: pd.DataFrame) -> str:
    """The Fig. 4b note: the input and GPU, and how far apart the methods' sparsities and errors
    are at their default knobs (from the table's rows)."""
    base = df[~df["method"].isin(["s2o", "full"])]
    s2o = df[df["method"] == "s2o"].iloc[0]
    spread = (
        f" At their default knobs S2O runs at sparsity {s2o['sparsity']:.3f} (MSE "
        f"{s2o['MSE']:.1e}), the baselines at {base['sparsity'].min():.3f}-"
        f"{base['sparsity'].max():.3f} (MSE {base['MSE'].min():.1e}-{base['MSE'].max():.1e}): "
        "the speedups are not at matched error; Fig. 4a compares the methods at matched sparsity."
        if len(base)
        else ""
    )
    return (
        f"**Differs:** {input_label(ctx, rec0)}, not Llama-3.1-8B's attention; "
        f"{device_label(rec0['environment'])}, not an A100.{spread}"
    )


def _knobs(rec: dict) -> str:
    m = rec["config"]["method"]
    main = {
        "s2o": ("tau", "segment_len"),
        "flexprefill": ("gamma", "tau"),
        "xattn": ("threshold", "stride"),
        "pbs": ("threshold", "segment_size"),
        "flashprefill": ("alpha", "dense_tail_tiles"),
    }
    keys = main.get(rec["config"].get("method_name", ""), ())
    return ", ".join(f"{k}={m[k]}" for k in keys if k in m) or "-"


def _data(rec: dict) -> str:
    d = rec["config"]["data"]
    if d["source"] == "model":
        return f"{rec['config']['model']['name']} on {d['text']}"
    return (
        f"SYNTHETIC Q/K/V ({d['heads_q']}/{d['heads_kv']} heads, D={d['head_dim']}, sink "
        f"{d['sink']}, background {d['background']})"
    )


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
    fig4a,
    fig4b,
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
