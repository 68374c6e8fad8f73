"""Appendix Fig. 5: S2O's top-k mode against block-sparse attention (BSA) at matched density,
non-causal, from the record of ``benchmarks/fig5_bsa.py`` pinned as ``records.fig5.bsa`` in
``results/manifest.yaml``. Reads the record only (never recomputes): one figure, speedup over SDPA
flash vs the top-k ratio, one panel per length, every point annotated with its measured density,
and one table from a DataFrame of the record's rows."""

from __future__ import annotations

import pandas as pd

from analysis.plotting import save, setup
from analysis.records import device_label
from analysis.sections import Section
from analysis.tables import markdown

LENGTHS = (32768, 131072)
GPU_COMMAND = (
    "`python -m benchmarks.fig5_bsa --rev <git sha>` (GPU; then pin `records.fig5.bsa: "
    "benchmarks/fig5_bsa/<id>/record.json` in `results/manifest.yaml`)"
)
# method -> (legend label, colour, marker)
METHODS = {
    "s2o_topk": ("S2O top-k, two-pass", "#e6550d", "o"),
    "s2o_topk_fused": ("S2O top-k, fused", "#fdae6b", "s"),
    "bsa": ("BSA (our block-sparse kernel)", "#3182bd", "^"),
}
COLUMNS = {
    "L": "L",
    "ratio": "top-k ratio",
    "method": "method",
    "density": "density",
    "estimate_ms": "estimate ms",
    "attention_ms": "attention ms",
    "flash_ms": "flash ms",
    "speedup": "speedup",
    "speedup_incl_estimate": "speedup incl. estimate",
    "ideal": "1 / density",
}
FORMATS = {
    "density": ".4f",
    "estimate ms": ".2f",
    "attention ms": ".2f",
    "flash ms": ".2f",
    "speedup": ".2f",
    "speedup incl. estimate": ".2f",
    "1 / density": ".2f",
}


def view(rec: dict) -> tuple[dict, dict]:
    """``(env, cfg)`` of a ``fig5_bsa`` benchmark record (:mod:`benchmarks.common`'s schema): the
    machine and command, and the configuration with the shape's fields at the top level."""
    if rec.get("benchmark") != "fig5_bsa":
        raise ValueError(f"not a fig5_bsa benchmark record (benchmark {rec.get('benchmark')!r})")
    e, cfg = rec["environment"], rec["config"]
    device = device_label(e) + (", TRITON_INTERPRET=1 smoke run" if cfg["smoke"] else "")
    env = {"device": device, "driver": e["driver"], "torch": e["torch"], "triton": e["triton"],
           "git_rev": e["git_revision"], "command": rec["command"]}  # fmt: skip
    return env, {**cfg, **cfg["shape"]}


def frame(rec: dict) -> pd.DataFrame:
    """The record's rows (one per length, ratio and method), sorted, with ``ideal`` = 1/density:
    the speedup of a kernel whose time is proportional to the tiles it computes."""
    df = pd.DataFrame(rec["metrics"]["rows"])
    df["ideal"] = 1.0 / df["density"]
    order = {m: i for i, m in enumerate(METHODS)}
    df = df.assign(_m=df["method"].map(order)).sort_values(["L", "ratio", "_m"])
    return df.drop(columns="_m").reset_index(drop=True)


def plot(df: pd.DataFrame, title: str, path) -> str:
    plt = setup()
    lengths = sorted(df["L"].unique())
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.6 * len(lengths), 3.6), squeeze=False)
    for ax, L in zip(axes[0], lengths):
        sub = df[df["L"] == L]
        for j, (method, (label, color, marker)) in enumerate(METHODS.items()):
            pts = sub[sub["method"] == method]
            if pts.empty:
                continue
            ax.plot(pts["ratio"], pts["speedup"], marker=marker, color=color, label=label)
            if method == "s2o_topk_fused":
                continue
            for x, y, d in zip(pts["ratio"], pts["speedup"], pts["density"]):
                ax.annotate(f"d={d:.3f}", (x, y), textcoords="offset points", fontsize=6,
                            xytext=(3, 6 if j == 0 else -10), color=color)  # fmt: skip
        ideal = sub[sub["method"] == "s2o_topk"]
        ax.plot(ideal["ratio"], ideal["ideal"], ls=":", color="#636363", label="1 / density")
        ax.axhline(1.0, color="#bdbdbd", lw=0.8)
        ax.set_xlabel("top-k ratio r (share of the ranked key tiles)")
        ax.set_ylabel("speedup over SDPA flash, attention only")
        ax.set_title(f"L = {L // 1024}K" if L >= 1024 else f"L = {L}")
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def _summary(df: pd.DataFrame) -> list[str]:
    """Per length: S2O's attention time over BSA's, and each method's speedup over 1/density."""
    lines = []
    for L, sub in df.groupby("L"):
        wide = sub.pivot(index="ratio", columns="method", values="attention_ms")
        rel = (wide["s2o_topk"] / wide["bsa"]).agg(["min", "max"])
        eff = (sub["speedup"] / sub["ideal"]).groupby(sub["method"]).agg(["min", "max"])
        parts = ", ".join(f"{m} {eff.loc[m, 'min']:.2f}-{eff.loc[m, 'max']:.2f}" for m in eff.index)
        lines.append(
            f"- L={L}: S2O two-pass attention time / BSA's {rel['min']:.2f}-{rel['max']:.2f} over "
            f"the ratios; speedup / (1 / density): {parts}."
        )
    return lines


def section(ctx) -> Section:
    sec = Section(
        "fig5",
        "Fig. 5: S2O vs BSA under matched sparsity (non-causal, 32K and 128K)",
        "Appendix Fig. 5 (A100; speedup over FA2 vs top-k block ratio, N=32K and 128K)",
    )
    rec, path = ctx.record("fig5.bsa")
    if rec is None:
        sec.missing_line(
            "a benchmarks/fig5_bsa.py record of S2O's top-k mode and the block-sparse kernel "
            "at matched density, non-causal, L=32K and 128K (records.fig5.bsa)",
            GPU_COMMAND,
        )
        return sec
    env, cfg = view(rec)
    df = frame(rec)
    title = f"S2O top-k vs BSA, non-causal, {cfg['dtype']}, {env['device']}"
    sec.files.append(plot(df, title, ctx.out / "fig5_bsa_topk.png"))
    table = df[list(COLUMNS)].rename(columns=COLUMNS)
    paper = ctx.paper.get("fig5", {})
    sec.body += [
        markdown(table, FORMATS),
        "",
        *_summary(df),
        "",
        f'Paper: "{paper.get("claim", "-")}" ({paper.get("cite", "Appendix Fig. 5")}); the '
        "figure's values are not in the paper's text.",
        f"**Differs:** {env['device']}, not an A100; BSA is the project's Triton block-sparse "
        "kernel (`s2o/kernels/block_sparse.py`) with a plain top-k mask (mean-pooled q.k block "
        "scores), not the BSA implementation the paper measured; the x axis is S2O's "
        "`topk_ratio` (share of the ranked key tiles walked after the dense own segment of "
        f"S={cfg['S']}), and BSA keeps "
        + (
            "per query block exactly as many tiles as S2O computes for that query tile "
            "(matched density by construction; both measured)"
            if cfg["bsa_budget"] == "matched"
            else "ceil(r x key blocks) per query block (S2O's density is higher by its own segment)"
        )
        + f"; B={cfg['B']}, {cfg['Hq']} query / {cfg['Hkv']} KV heads, D={cfg['D']}, "
        f"{cfg['block']}x{cfg['block']} tiles; input: eval/synthetic.py (`--input "
        f"{cfg['input']}`, seed {cfg['seed']}; in the top-k mode the "
        f"tile counts do not depend on it). Flash: {cfg['flash']}, non-causal.",
    ]
    sec.sources.append(
        f"`{path}` ({env['device']}, driver {env['driver']}, torch {env['torch']}, Triton "
        f"{env['triton']}, git {str(env['git_rev'])[:7]}); made by `{env['command']}`"
    )
    if cfg["smoke"]:
        sec.body.insert(0, "**Not a measurement:** this record is a CPU smoke run of the "
                        "script under the Triton interpreter (tiny shapes); its times say "
                        "nothing about speed.\n")  # fmt: skip
        sec.missing_line("a GPU record (the pinned one is a CPU smoke run)", GPU_COMMAND)
    else:
        lacking = [L for L in LENGTHS if L not in set(df["L"])]
        if lacking:
            sec.missing_line(f"rows at L={', '.join(map(str, lacking))}", GPU_COMMAND)
    return sec
