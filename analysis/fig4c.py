"""Fig. 4c: the end-to-end prefill breakdown across lengths (SDPA flash, cuDNN, S2O), from the
kind=e2e records pinned under ``records.e2e``."""

from __future__ import annotations

import pandas as pd

from analysis.e2e_table import breakdown, model_label, random_weights
from analysis.plotting import save, setup
from analysis.records import device_label, git_short
from analysis.sections import Ctx, Section
from analysis.tables import markdown


def section(ctx: Ctx) -> Section:
    sec = Section(
        "fig4c",
        "Fig. 4c: end-to-end prefill breakdown across lengths",
        "Fig. 4c (Llama-3.1-8B, A100)",
    )
    found = []
    for model in ("llama31_8b", "qwen3_8b", "gemma3_270m", "smollm2_135m"):
        rec, path = ctx.record(f"e2e.{model}")
        if rec is not None:
            found.append((model, rec, path))
    if not found:
        sec.missing_line(
            "kind=e2e records (records.e2e.*)",
            "`python run.py kind=e2e model=llama31_8b model.weights=random` (GPU)",
        )
        return sec
    plt = setup()
    ncol = min(2, len(found))
    nrow = -(-len(found) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.6 * ncol, 3.6 * nrow), squeeze=False)
    for ax in axes.flat[len(found) :]:
        ax.set_visible(False)
    for ax, (model, rec, path) in zip(axes.flat, found):
        df = breakdown(rec)
        df = df[df["label"].isin(["full_flash", "full_cudnn", "s2o"])]
        df["attn_total_ms"] = df["estimate_ms"] + df["attention_ms"]
        lengths = sorted(df["L"].unique())
        labels = ["full_flash", "full_cudnn", "s2o"]
        width = 0.26
        top = 1.0
        for j, lab in enumerate(labels):
            sub = df[df["label"] == lab].set_index("L").reindex(lengths)
            x = [i + (j - 1) * width for i in range(len(lengths))]
            flash = df[df["label"] == "full_flash"].set_index("L").reindex(lengths)["total_ms"]
            attn = (sub["attn_total_ms"] / flash).tolist()
            rest = (sub["rest_ms"] / flash).tolist()
            top = max([top] + [a + b for a, b in zip(attn, rest)])
            color = ("#636363", "#3182bd", "#e6550d")[j]
            short = {"full_flash": "flash", "full_cudnn": "cuDNN", "s2o": "S2O"}[lab]
            ax.bar(x, attn, width, color=color, label=f"{short}: attention+estimation")
            ax.bar(x, rest, width, bottom=attn, color=color, alpha=0.35, label=f"{short}: rest")
        ax.set_xticks(range(len(lengths)), [f"{int(v) // 1024}K" for v in lengths])
        ax.set_ylabel("prefill time / SDPA flash prefill time")
        ax.set_title(f"{model_label(rec, model)}, {device_label(rec['environment'])}", fontsize=8)
        ax.set_ylim(0, top * 1.6)
        ax.legend(fontsize=6, ncol=2, loc="upper left")
        sec.sources.append(
            f"`{path}` ({device_label(rec['environment'])}, git {git_short(rec['environment'])})"
        )
    sec.files.append(save(fig, ctx.out / "fig4c_e2e_breakdown.png"))
    rows = []
    for model, rec, _ in found:
        df = breakdown(rec)
        for _, r in df[df["label"] == "s2o"].iterrows():
            rows.append(
                {
                    "model": model + (" (random weights)" if random_weights(rec) else " (trained)"),
                    "L": int(r["L"]),
                    "S2O density": r["density"],
                    "S2O total ms": r["total_ms"],
                    "S2O vs flash": r["speedup_vs_flash"],
                    "S2O vs cuDNN": r["speedup_vs_cudnn"],
                    "bound vs flash": r["attention_bound_vs_flash"],
                }
            )
    fmt = {
        "S2O density": ".3f",
        "S2O total ms": ".1f",
        "S2O vs flash": ".2f",
        "S2O vs cuDNN": ".2f",
        "bound vs flash": ".2f",
    }
    sec.body += [
        markdown(pd.DataFrame(rows), fmt),
        "",
        f"Paper: {ctx.paper['claims']['e2e_speedup_128k']}x end to end at 128K (trained "
        "Llama-3.1-8B, A100); the per-length bars are not in the paper's text. `bound vs flash`: "
        "the speedup of a model whose attention took no time at all (no attention-only method "
        "beats it). Full per-method tables: `results/e2e/README.md`.",
        "**Differs:** the 8B architectures have random weights and random token ids (densities not "
        "those of a trained model; one timed prefill per point); Gemma 3 270M and SmolLM2-135M "
        "have trained weights on the essays, but are small models whose numbers are theirs: "
        "Gemma's 15 sliding-window layers bound any full-attention method at about 1.05x, and at "
        "SmolLM2's size every method's estimation costs more than the attention it saves "
        "(`results/e2e/README.md`). H100, not A100.",
    ]
    return sec
