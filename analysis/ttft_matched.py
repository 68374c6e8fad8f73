"""Time to first token of S2O and FlashPrefill at matched density (issue 47, target 2), from the
kind=e2e records pinned under ``records.ttft_matched.qwen25_coder_1p5b`` (a list).

1. A record holds, at each length, each method's main knob swept in one process beside the dense
   model (S2O's ``tau``, FlashPrefill's ``alpha``: :data:`SWEPT`). A *family* is one method's
   rows that share every other knob (S2O with ``step1_sort: cub`` is another family than S2O's
   default). A row's knobs are its ``knobs`` (every knob it ran with); a record made before rows
   kept them gives the knobs its ``e2e.methods`` entry named (the job's own method and a bare
   name: none).
2. Matching, inside one record and one length, for each pair of an S2O family and a FlashPrefill
   family: each measured point (density, total ms) of one family is set against the other
   family's time at the same density, linear in density between its two points around it
   (:func:`bracket`); outside the other family's measured densities there is no number, and the
   table says which range it had.
3. Each row: the ratio S2O / FlashPrefill of the total time, S2O's estimation and sparse attention
   (interpolated with the same weights where S2O's side is), each method's speedup over the dense
   model through the plug-in (SDPA flash and cuDNN, same record and length) and S2O's share of
   its Amdahl bound at that density (:func:`eval.amdahl.amdahl_ms` of the cuDNN row over S2O's
   time: ``analysis/e2e_table.py`` ``ttft_frame``'s share).
4. The sentences come from :data:`RULES` (per length and pair) and :data:`TARGET_RULES` (the
   issue's target over its lengths: met at a length where some S2O family without a named variant
   is faster at every density it was matched at), filled with the frame's numbers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence

import pandas as pd

from analysis.records import device_label, git_short
from analysis.sections import Ctx, Section
from analysis.tables import markdown
from eval.amdahl import amdahl_ms
from s2o.methods.s2o import variants_on

PAIR = ("s2o", "flashprefill")
NAMES = {"s2o": "S2O", "flashprefill": "FlashPrefill"}
OTHER = {"s2o": "flashprefill", "flashprefill": "s2o"}
SWEPT = {"s2o": "tau", "flashprefill": "alpha"}  # each method's main knob, swept in one job
TARGET_LENGTHS = (32768, 65536, 131072)  # issue 47, target 2: 32K, 64K (YaRN), 128K (YaRN)
MANIFEST_KEY = "ttft_matched.qwen25_coder_1p5b"

# beside the job's own S2O (tau 0.005, row `s2o`): FlashPrefill around Qwen's official alpha 0.08
SWEEP = (
    "'e2e.methods=[{name:s2o,tau:0.002},{name:s2o,tau:0.01},{name:s2o,tau:0.02},"
    "{name:s2o,tau:0.05},{name:flashprefill,alpha:0.03},{name:flashprefill,alpha:0.05},"
    "{name:flashprefill,alpha:0.08},{name:flashprefill,alpha:0.12},{name:flashprefill,alpha:0.2}]'"
)
COMMANDS = (
    f"python run.py kind=e2e model=qwen25_coder_1p5b 'e2e.lengths=[32768]' {SWEEP}",
    f"python run.py kind=e2e model=qwen25_coder_1p5b model.yarn=true "
    f"'e2e.lengths=[65536,131072]' {SWEEP}",
)

RULES = (  # (test on one length and pair's numbers, sentence); the first that holds is said
    (lambda v: v["matched"] == 0,
     "{where}: no density where both were measured (S2O at {s_span}, FlashPrefill at "
     "{f_span}): no comparison at matched density."),
    (lambda v: v["faster"] == v["matched"],
     "{where}: S2O is faster than FlashPrefill at every matched density ({points}, "
     "S2O / FlashPrefill {ratios})."),
    (lambda v: v["faster"] == 0,
     "{where}: FlashPrefill is faster than S2O at every matched density ({points}, "
     "S2O / FlashPrefill {ratios})."),
    (lambda v: True,
     "{where}: S2O is faster at {faster} of {matched} matched densities (S2O / FlashPrefill "
     "{ratios})."),
)  # fmt: skip
_TARGET = (
    "Target (S2O, the paper's method without a named variant, faster than FlashPrefill at "
    "matched density at {targets})"
)
TARGET_RULES = (  # (test on the per-length outcomes, sentence)
    (lambda t: t["unmeasured"], _TARGET + ": open, no matched point at {unmeasured}."),
    (lambda t: not t["missed"], _TARGET + ": met at every one."),
    (lambda t: True, _TARGET + ": missed at {missed}."),
)


def bracket(densities: Sequence[float], density: float) -> list[tuple[int, float]] | None:
    """``[(index, weight)]`` whose weighted sum of the points' values is the piecewise-linear
    value at ``density``: the points at exactly that density (equal weights), else the nearest
    point on each side; ``None`` outside ``[min, max]`` of ``densities`` (no extrapolation)."""
    if not densities or not min(densities) <= density <= max(densities):
        return None
    same = [i for i, d in enumerate(densities) if d == density]
    if same:
        return [(i, 1.0 / len(same)) for i in same]
    lo = max((i for i, d in enumerate(densities) if d < density), key=lambda i: densities[i])
    hi = min((i for i, d in enumerate(densities) if d > density), key=lambda i: densities[i])
    w = (density - densities[lo]) / (densities[hi] - densities[lo])
    return [(lo, 1.0 - w), (hi, w)]


def at(points: list[dict], weights: list[tuple[int, float]], key: str) -> float:
    return sum(points[i][key] * w for i, w in weights)


def entry_label(entry: dict) -> str:
    """The row label ``experiments/e2e.py`` ``configurations`` gives an ``e2e.methods`` mapping
    (``{name: s2o, tau: 0.02}`` -> ``s2o_tau0.02``); for records whose rows lack ``knobs``."""
    knobs = {k: v for k, v in entry.items() if k != "name"}
    return entry["name"] + "_" + "_".join(f"{k}{v}" for k, v in sorted(knobs.items()))


def row_knobs(row: dict, config: dict) -> dict:
    """Every knob the row ran with, else (older records) the knobs its entry named."""
    if "knobs" in row:
        return row["knobs"]
    for entry in (config.get("e2e") or {}).get("methods") or []:
        if isinstance(entry, dict) and entry_label(entry) == row["label"]:
            return {k: v for k, v in entry.items() if k != "name"}
    return {}


def families(rec: dict) -> dict[int, dict[tuple[str, str], list[dict]]]:
    """``{L: {(method, other knobs as JSON): rows sorted by density}}`` of S2O and FlashPrefill."""
    out: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    for r in rec["metrics"]["rows"]:
        method = r.get("method") or r["label"].split("_")[0]
        if method not in PAIR or "error" in r or r.get("density") is None:
            continue
        rest = {k: v for k, v in row_knobs(r, rec["config"]).items() if k != SWEPT[method]}
        out[r["L"]][(method, json.dumps(rest, sort_keys=True, default=str))].append(r)
    return {L: {k: sorted(v, key=lambda r: r["density"]) for k, v in fams.items()}
            for L, fams in sorted(out.items())}  # fmt: skip


def family_names(rec: dict) -> dict[tuple[str, str], str]:
    """A family's name: its method and the knobs in which it differs from the method's base
    family, the one holding the row of the method at its defaults (label ``s2o``); without such a
    row, every knob whose value differs among the method's families. ``s2o``, ``s2o
    step1_sort=cub``, ``s2o launch.pass2.walk=triton``."""
    fams = families(rec)
    keys = {k for by_key in fams.values() for k in by_key}
    base = {m: rest for by_key in fams.values() for (m, rest), rows in by_key.items()
            if any(r["label"] == m for r in rows)}  # fmt: skip
    names = {}
    for method, rest in keys:
        mine = json.loads(rest)
        if method in base:
            ref = [json.loads(base[method])]
        else:
            ref = [json.loads(r) for m, r in keys if m == method]
        vary = sorted({k for o in ref for k in set(o) | set(mine) if o.get(k) != mine.get(k)})
        names[(method, rest)] = " ".join([method] + [_knob(k, mine[k]) for k in vary if k in mine])
    return names


def _knob(key: str, value) -> str:
    """``key=value``, a mapping flattened to dotted keys (``launch.pass2.walk=triton``)."""
    if isinstance(value, dict) and value:
        return " ".join(_knob(f"{key}.{k}", v) for k, v in sorted(value.items()))
    return f"{key}={value}"


def matched_rows(s2o: list[dict], fp: list[dict], dense: dict) -> list[dict]:
    """One row per measured point of either family (``side``: its method) with the other
    family's time at its density (an exact shared density once, from S2O's side); ``dense``:
    the length's rows by label."""
    out = []
    for side, points, other in (("s2o", s2o, fp), ("flashprefill", fp, s2o)):
        for p in points:
            if side == "flashprefill" and any(q["density"] == p["density"] for q in s2o):
                continue
            w = bracket([q["density"] for q in other], p["density"])
            sides = {side: ([p], [(0, 1.0)]), OTHER[side]: (other, w)}
            row = {"side": side, "measured": p["label"], "density": p["density"]}
            if w is None:
                row["match"] = f"outside {NAMES[OTHER[side]]}'s {_span(other)}"
            elif other[w[0][0]]["density"] == p["density"]:
                row["match"] = "both measured"
            else:
                row["match"] = f"{NAMES[OTHER[side]]} interpolated"
            out.append(row | _times(sides, p["density"], dense))
    return sorted(out, key=lambda r: r["density"])


def _times(sides: dict, density: float, dense: dict) -> dict:
    """A matched row's numbers from each method's ``(points, weights)`` (weights None: none)."""
    row = {}
    for m, (points, w) in sides.items():
        if w is not None:
            row[f"{NAMES[m]} ms"] = at(points, w, "total_ms")
    if "S2O ms" in row:
        s2o, w = sides["s2o"]
        row["S2O estimate ms"] = at(s2o, w, "estimate_ms")
        row["S2O sparse attn ms"] = at(s2o, w, "sparse_attention_ms")
        if "FlashPrefill ms" in row:
            row["S2O / FlashPrefill"] = row["S2O ms"] / row["FlashPrefill ms"]
    for m in PAIR:
        for kernel in ("flash", "cudnn"):
            d = dense.get(f"full_{kernel}")
            if d is not None and f"{NAMES[m]} ms" in row:
                row[f"{NAMES[m]} vs {kernel}"] = d["total_ms"] / row[f"{NAMES[m]} ms"]
    if "full_cudnn" in dense and "S2O ms" in row:
        row["S2O share of bound"] = amdahl_ms(dense["full_cudnn"], density) / row["S2O ms"]
    return row


COLUMNS = (
    "L", "S2O", "FlashPrefill", "measured", "density", "match", "S2O ms", "FlashPrefill ms",
    "S2O / FlashPrefill", "S2O estimate ms", "S2O sparse attn ms", "S2O vs flash", "S2O vs cudnn",
    "FlashPrefill vs flash", "FlashPrefill vs cudnn", "S2O share of bound",
)  # fmt: skip
FORMATS = (
    {c: ".1f" for c in COLUMNS if c.endswith(" ms")}
    | {c: ".2f" for c in COLUMNS if c.endswith(("flash", "cudnn"))}
    | {"density": ".3f", "S2O / FlashPrefill": ".3f", "S2O share of bound": ".3f"}
)


def matched_frame(recs: list[dict]) -> pd.DataFrame:
    """One row per measured point of each (S2O family, FlashPrefill family) pair at each length of
    each record (:func:`matched_rows`), with ``record``: its id, and ``paper's method``: whether the
    S2O family turns on no named variant."""
    out = []
    for rec in recs:
        names = family_names(rec)
        for L, fams in families(rec).items():
            rows = rec["metrics"]["rows"]
            dense = {r["label"]: r for r in rows if r["L"] == L and "error" not in r}
            pairs = [(s, f) for s in fams if s[0] == "s2o" for f in fams if f[0] == "flashprefill"]
            for s, f in pairs:
                head = {
                    "record": rec.get("id", ""),
                    "L": L,
                    "S2O": names[s],
                    "FlashPrefill": names[f],
                    "paper's method": not variants_on(json.loads(s[1])),
                }
                out += [head | row for row in matched_rows(fams[s], fams[f], dense)]
    df = pd.DataFrame(out, columns=["record", "side", "paper's method", *COLUMNS])
    return df.sort_values("L", kind="stable", ignore_index=True)


def _span(points: list[dict]) -> str:
    lo, hi = points[0]["density"], points[-1]["density"]
    return f"one density ({lo:.3f})" if lo == hi else f"densities ({lo:.3f} to {hi:.3f})"


def _size(L: int) -> str:
    return f"{L // 1024}K" if L % 1024 == 0 else str(L)


def verdicts(df: pd.DataFrame) -> list[str]:
    """One sentence per (record, length, pair) from :data:`RULES`, then the target's from
    :data:`TARGET_RULES`: met at a length where some S2O family of the paper's method (no named
    variant, :func:`~s2o.methods.s2o.variants_on`) is faster (ratio below 1) at every density
    it was matched at, against every FlashPrefill family there."""
    out, met = [], defaultdict(list)
    for (_, L, s, f), g in df.groupby(["record", "L", "S2O", "FlashPrefill"], sort=False):
        ratio = g["S2O / FlashPrefill"].dropna()
        sd = g.loc[g["side"] == "s2o", "density"]
        fd = g.loc[(g["side"] == "flashprefill") | (g["match"] == "both measured"), "density"]
        lo, hi = f"{ratio.min():.2f}", f"{ratio.max():.2f}"
        v = {"where": f"{_size(L)}, {s} against {f}", "matched": len(ratio),
             "faster": int((ratio < 1).sum()), "ratios": lo if lo == hi else f"{lo} to {hi}",
             "points": f"{len(ratio)} point" + ("s" * (len(ratio) != 1)),
             "s_span": _span([{"density": d} for d in sorted(sd)]),
             "f_span": _span([{"density": d} for d in sorted(fd)])}  # fmt: skip
        out.append(next(text for test, text in RULES if test(v)).format(**v))
        if g["paper's method"].all():  # a named variant's family gets its sentence, not the target
            met[(L, s)].append(v["matched"] > 0 and v["faster"] == v["matched"])
    t = {
        "targets": ", ".join(_size(L) for L in TARGET_LENGTHS),
        "unmeasured": ", ".join(_size(L) for L in TARGET_LENGTHS
                                if not df.loc[df["L"] == L, "S2O / FlashPrefill"].notna().any()),
        "missed": ", ".join(_size(L) for L in TARGET_LENGTHS
                            if not any(all(v) for (l, _), v in met.items() if l == L)),
    }  # fmt: skip
    out.append(next(text for test, text in TARGET_RULES if test(t)).format(**t))
    return out


def figure(recs: list[dict], title: str):
    """Total time against density, one panel per record and length: each family's measured
    points joined by the lines the matching interpolates on, the dense model's times dashed."""
    from analysis.plotting import setup

    plt = setup()
    panels = [(rec, L, fams) for rec in recs for L, fams in families(rec).items()]
    panels.sort(key=lambda panel: panel[1])
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0), squeeze=False)
    for ax, (rec, L, fams) in zip(axes[0], panels):
        names = family_names(rec)
        for key, pts in fams.items():
            style = "o-" if key[0] == "s2o" else "s--"
            ax.plot([p["density"] for p in pts], [p["total_ms"] for p in pts], style,
                    label=names[key], ms=4)  # fmt: skip
        for r in rec["metrics"]["rows"]:
            if r["L"] == L and r["label"] in ("full_flash", "full_cudnn") and "error" not in r:
                ax.axhline(r["total_ms"], color="grey", lw=0.8, ls=":" if "cudnn" in r["label"]
                           else "--")  # fmt: skip
        ax.set_title(f"L={_size(L)} (grey: full_flash --, full_cudnn ..)", fontsize=7)
        ax.set_xlabel("density")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("time to first token (ms)")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return fig


def section(ctx: Ctx) -> Section:
    """S2O against FlashPrefill at matched density on Qwen2.5-Coder-1.5B-Instruct, per length."""
    from analysis.plotting import save

    sec = Section(
        "ttft_matched",
        "Time to first token at matched density: S2O against FlashPrefill, Qwen2.5-Coder-1.5B",
        "none (issue 47, target 2: both methods' main knobs swept in one job, matched by density)",
    )
    node = ctx.manifest.get("records") or {}
    for part in MANIFEST_KEY.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    how = " and ".join(f"`{c}`" for c in COMMANDS) + " (GPU; docs/models.md, Time to first token)"
    paths = [p for p in node or [] if (ctx.results / p).is_file()]
    for p in node or []:
        if p not in paths:
            sec.missing_line(f"`results/{p}` (pinned at records.{MANIFEST_KEY}, not there)", how)
    recs = [json.loads((ctx.results / p).read_text()) for p in paths]
    ok = [(p, r) for p, r in zip(paths, recs) if r.get("status") == "ok"]
    for p, r in zip(paths, recs):
        if r.get("status") != "ok":
            sec.missing_line(f"an ok record in place of `results/{p}` ({r.get('status')})", how)
    df = matched_frame([r for _, r in ok])
    for p, r in ok:
        for L, fams in families(r).items():
            for m in PAIR:
                if not any(k[0] == m for k in fams):
                    sec.missing_line(f"{m} rows at L={L} in `results/{p}`", how)
    if df.empty:
        if not sec.missing:
            sec.missing_line(
                f"kind=e2e records of qwen25_coder_1p5b with S2O's tau and FlashPrefill's alpha "
                f"swept in one job (records.{MANIFEST_KEY}: a list)", how,
            )  # fmt: skip
        return sec
    env = ok[0][1]["environment"]
    title = f"Qwen2.5-Coder-1.5B-Instruct, {device_label(env)}"
    sec.files.append(save(figure([r for _, r in ok], title), ctx.out / "ttft_matched_qwen25.png"))
    cols = list(COLUMNS) if df.groupby("L")["record"].nunique().max() <= 1 else ["record", *COLUMNS]
    sec.body += [
        markdown(df[cols], FORMATS),
        "",
        "Each row is one measured point (`measured`: its configuration) with the other method's "
        "time at the same density, linear in density between that method's two points around "
        "it, from the same record and length; never extrapolated (`match` gives the other's "
        "range instead). `S2O / FlashPrefill`: below 1, S2O is faster. `vs flash` / `vs cudnn`: "
        "the dense model through the plug-in (full_flash, full_cudnn) over the method's time. "
        "`S2O share of bound`: the Amdahl time at that density (the cuDNN run's non-attention "
        "time + density x its attention time; estimation free) over S2O's time. S2O's estimate "
        "and sparse attention are interpolated with the same weights as its total. 64K and 128K "
        "run with YaRN (factor 4 over 32K).",
        "",
        *(f"- {v}" for v in verdicts(df)),
    ]
    sec.sources += [f"`results/{p}` ({device_label(r['environment'])}, git "
                    f"{git_short(r['environment'])})" for p, r in ok]  # fmt: skip
    return sec
