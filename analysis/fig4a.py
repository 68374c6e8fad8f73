"""Fig. 4a: MSE against sparsity, each method bisected to matched sparsity, from the kind=matched
records pinned for the experiments of :data:`FIG4A`."""

from __future__ import annotations

import pandas as pd

from analysis import calibration_check, plot_mse_vs_sparsity
from analysis.inputs import calibrated, input_label, mistokenized
from analysis.records import device_label, experiment_commands, git_short, rel_path
from analysis.sections import Ctx, Section, missing_baselines
from analysis.tables import markdown

# the Fig. 4a records, in order: the paper's shape (128K), then real captured attention (32K, 8K)
FIG4A = (
    (
        "fig4a_mse_vs_sparsity",
        "`python run.py experiment=fig4a_mse_vs_sparsity data.text=...` (GPU)",
    ),
    (
        "fig4a_gemma3_270m_32k",
        "`python run.py experiment=fig4a_mse_vs_sparsity scale=gemma3_270m_32k` (GPU)",
    ),
    (
        "fig4a_gemma3_270m_8k",
        "`python run.py experiment=fig4a_mse_vs_sparsity scale=gemma3_270m_8k` (CPU, about 12 min)",
    ),
    (
        "fig4a_smollm2_135m_8k",
        "`python run.py experiment=fig4a_mse_vs_sparsity scale=smollm2_135m_8k` (CPU)",
    ),
)


def _fig4a_table(rec: dict) -> pd.DataFrame | None:
    """MSE per method at each target sparsity, ``(at x)`` where the method's knob range ended at
    sparsity x instead (farther than the record's reach rule, ``calibration_check.reach``), and
    the record's best baseline over S2O (``experiments.matched.ratios``: only methods that reached
    the target count)."""
    rows = [
        {"method": name, "target": p["target"], "sparsity": p["sparsity"], "mse": p["mse"]}
        for name, r in rec["metrics"]["methods"].items()
        if r.get("status") == "ok"
        for p in r.get("at_sparsity", [])
    ]
    if not rows:
        return None
    df = pd.DataFrame(rows)
    hit = (df["sparsity"] - df["target"]).abs() <= calibration_check.reach(rec)
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


def _fig4a_title(ctx: Ctx, rec: dict) -> str:
    """The figure's input line: which model's attention, or which synthetic input."""
    data = rec["config"]["data"]
    if data["source"] == "model":
        return f"{rec['config']['model']['name']}'s captured attention ({data['text']})"
    if calibrated(ctx, data):
        return "calibrated synthetic input (data=synthetic_calibrated)"
    return "uncalibrated synthetic input (eval/synthetic.py)"


def _fig4a_differs(ctx: Ctx, rec: dict, df: pd.DataFrame | None) -> str:
    """One record's line of the Differs note: its input, device and measured ratio range."""
    ratios = [] if df is None else df["best baseline / S2O"].dropna().tolist()
    got = (
        f"the best baseline's MSE is {min(ratios):.2f}x to {max(ratios):.2f}x S2O's"
        if ratios
        else "no target reached by S2O and a baseline"
    )
    return f"- {input_label(ctx, rec)} on {device_label(rec['environment'])}: {got}."


def section(ctx: Ctx) -> Section:
    sec = Section(
        "fig4a", "Fig. 4a: MSE vs sparsity at matched sparsity", "Fig. 4a (Llama-3.1-8B, 128K)"
    )
    differs = []
    commands = experiment_commands()
    for name, how in FIG4A:
        rec = ctx.experiment(name)
        if rec is None:
            sec.missing_line(f"the kind=matched record of {commands[name]}", how)
            continue
        missing_baselines(sec, set(rec["metrics"]["methods"]),
                          f"the kind=matched record of {commands[name]}",
                          f"{how}; every method again, one record")  # fmt: skip
        out = ctx.out / f"{name}.png"
        plot_mse_vs_sparsity.plot(rec, out, _fig4a_title(ctx, rec))
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
            f"{git_short(rec['environment'])}, {_fig4a_input(ctx, rec)})"
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
