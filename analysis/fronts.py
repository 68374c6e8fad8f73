"""Issue 34's accuracy-vs-density fronts: every method along its main knob on one model and
benchmark (``conf/experiment/accuracy_qwen_fronts.yaml``), from the kind=accuracy records pinned
under ``records.fronts.<model>`` (reads records and their samples only).

The records are kept apart from ``records.accuracy`` on purpose: there, every record joins the
model's table and its Holm family (the defaults' confirmatory comparisons). Here the family is
this page's own: every informative comparison against ``full`` of the fronts, on every task.

Per task, one table: each record's knob setting (the overrides of the experiment's sweep point
it was made by: ``tau=0.02``, ``S=1024 tau=0.005``, ``gamma=0.85``), mean density, accuracy with
its 95% interval, n, and the paired comparison with ``full`` on the same samples
(``analysis/accuracy_tables.py`` ``row``: McNemar's exact test for 0/1 scores, Tango's interval),
its p Holm-adjusted over the page's family, the verdict. The capability gate is the accuracy
pages' (``dense_floor``, ``analysis/settings.yaml``). The figure: one panel per task, accuracy
against density, one line per method through its points ordered by density, each method's
default setting marked, ``full`` a horizontal line with its interval as a band. The experiment's
sweep points without a pinned record are listed with the command that makes them.

A method's default setting is read from ``conf/`` (``conf/config.yaml``'s ``tau`` and ``S``,
``conf/method/<method>.yaml``); a default that a resolver computes from the model (FlashPrefill's
alpha, ``run.py`` ``flashprefill_alpha``: a rule of the library, which analysis does not import)
is not known here, and that method's default is left unmarked (the page says so).

    python analysis/fronts.py [--results results] [--out results/figures]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import shlex
from collections import defaultdict
from pathlib import Path

import pandas as pd
import yaml

from analysis import accuracy_tables as at
from analysis.records import CONF, MANIFEST, device_label
from analysis.sections import Ctx, Section
from analysis.tables import markdown

EXPERIMENT = "accuracy_qwen_fronts"
MODEL = "qwen25_coder_1p5b"
STEM = f"fronts_{MODEL}"  # the page and figure of the default model
COMMAND = (f"`python run.py -m experiment={EXPERIMENT} hydra/launcher=node_gpus "
           "hydra.launcher.jobs_per_gpu=3` (GPU; resumable: it skips a job whose record exists "
           "at the same code revision, so at another revision it reruns every job), then pin "
           "the new records under `records.fronts` in `results/manifest.yaml`")  # fmt: skip
UNKNOWN = object()  # a default that conf/ alone does not give (a resolver of the model)
_SHORTCUT = re.compile(r"^\$\{(\w+)\}$")  # `segment_len: ${S}`: the top-level shortcut S


def expand(point: str) -> list[dict]:
    """The jobs of one ``hydra.sweeper.points`` entry: the product of its comma-separated value
    lists (``method=s2o tau=0.005,0.02 S=1024,4096`` -> 4 jobs), each ``{override: value}`` with
    YAML-typed values (``false`` -> False, ``0.02`` -> 0.02). Plain values only: a sweep function
    (``range(...)``) or a quoted list is refused (``ValueError``), never guessed."""
    keys, values = [], []
    for token in shlex.split(point):
        key, sep, text = token.partition("=")
        if not sep or not key or any(c in text for c in "()[]{}'\""):
            raise ValueError(f"sweep point {point!r}: cannot read {token!r}")
        keys.append(key)
        values.append([yaml.safe_load(v) for v in text.split(",")])
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def sweep_points(experiment: Path) -> list[dict]:
    """Every job of the experiment file's ``hydra.sweeper.points``, in order, each once (the
    points sweeper's order, ``hydra_plugins/s2o_sweepers/points.py``)."""
    cfg = yaml.safe_load(Path(experiment).read_text()) or {}
    points = ((cfg.get("hydra") or {}).get("sweeper") or {}).get("points") or []
    jobs, seen = [], set()
    for point in points:
        for job in expand(point):
            key = json.dumps(job, sort_keys=True)
            if key not in seen:
                seen.add(key)
                jobs.append(job)
    return jobs


def method_defaults(method: str, conf: Path = CONF) -> tuple[dict, dict]:
    """``(knobs, shortcuts)`` of a method as ``conf/`` sets them: its knobs with the top-level
    shortcuts of ``conf/config.yaml`` filled in (S2O's ``segment_len: ${S}``), :data:`UNKNOWN`
    where a resolver computes the value; and ``{shortcut: knob}`` (``{"S": "segment_len"}``).
    The knobs as they take effect (``accuracy_tables.knobs``: S2O's ``q_perm: null`` -> its
    variant's)."""
    top = yaml.safe_load((conf / "config.yaml").read_text()) or {}
    own = yaml.safe_load((conf / "method" / f"{method}.yaml").read_text()) or {}
    knobs, shortcuts = {}, {}
    for key, value in own.items():
        if isinstance(value, str) and (m := _SHORTCUT.match(value)) and m.group(1) in top:
            knobs[key], shortcuts[m.group(1)] = top[m.group(1)], key
        elif isinstance(value, str) and "${" in value:
            knobs[key] = UNKNOWN
        else:
            knobs[key] = value
    return at.knobs({"method": method, "metrics": {"knobs": knobs}}), shortcuts


def _same(a, b) -> bool:
    if a is UNKNOWN or b is UNKNOWN:
        return False
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, int | float) and isinstance(b, int | float)
        return ok and not isinstance(a, bool) and not isinstance(b, bool) and math.isclose(a, b)
    return a == b


def plan(experiment: Path, conf: Path = CONF) -> list[dict]:
    """The experiment's sweep points, each a dict: ``method``; ``label`` (its own overrides,
    ``S=1024 tau=0.005``, ``q_perm=False tau=0.005``; ``full`` for a method without knobs set);
    ``knobs`` (the swept knobs as the job sets them: conf's defaults and the point's overrides);
    ``default`` (True where the swept knobs are the method's defaults, None where a default is
    not known from conf/)."""
    jobs = sweep_points(experiment)
    by_method = defaultdict(list)
    for job in jobs:
        by_method[job["method"]].append(job)
    out = []
    for method, mine in by_method.items():
        defaults, shortcuts = method_defaults(method, conf)
        swept = []  # the knob names this method's points set, in order
        for job in mine:
            for key in job:
                if key != "method":
                    knob = shortcuts.get(key, key.removeprefix("method."))
                    swept += [knob] if knob not in swept else []
        for job in mine:
            knobs = {k: defaults.get(k, UNKNOWN) for k in swept}
            names = []
            for key, value in job.items():
                if key != "method":
                    knobs[shortcuts.get(key, key.removeprefix("method."))] = value
                    names.append((key.removeprefix("method."), value))
            label = " ".join(f"{k}={v}" for k, v in sorted(names)) or method
            known = all(defaults.get(k, UNKNOWN) is not UNKNOWN for k in swept)
            default = bool(swept) and all(_same(knobs[k], defaults.get(k)) for k in swept)
            out.append({"method": method, "label": label, "knobs": knobs,
                        "default": default if known else None})  # fmt: skip
    return out


def match(recs: list[dict], points: list[dict]) -> list[dict]:
    """Each record's point (``_point``, None for a record no point makes) and labels (``_label``:
    ``method setting``; ``_setting``: the setting alone); the points without a record."""
    taken = set()
    for r in recs:
        knobs = at.knobs(r)
        found = [i for i, p in enumerate(points) if p["method"] == r["method"]
                 and all(_same(knobs.get(k), v) for k, v in p["knobs"].items())]  # fmt: skip
        r["_point"] = points[found[0]] if found else None
        setting = points[found[0]]["label"] if found else f"[{r['id'][:8]}]"
        if found and found[0] in taken:  # two records of one point: tell them apart
            setting += f" [{r['id'][:8]}]"
        taken.update(found[:1])
        r["_setting"] = "-" if r["method"] == "full" and setting == "full" else setting
        r["_label"] = r["method"] if r["_setting"] == "-" else f"{r['method']} {r['_setting']}"
    return [p for i, p in enumerate(points) if i not in taken]


def _cells(recs: list[dict], floor: float) -> list[tuple]:
    """``(task, length, rows)`` per task cell (``accuracy_tables.row`` against the newest ``full``
    record holding it; gated as the accuracy pages are), and the page's family: every
    informative comparison, Holm-adjusted (``p_adj``) over all of them."""
    fulls = sorted((r for r in recs if r["method"] == "full"),
                   key=lambda r: r["environment"]["time"], reverse=True)  # fmt: skip
    done = []
    for task, length in at.cell_keys(recs):
        if task == "all":
            continue
        ref = next((r for r in fulls if at.cell(r, task, length)), None)
        rows = []
        for r in recs:
            if (x := at.row(r, task, length, ref)) is not None:
                x["default"] = (r["_point"] or {}).get("default")
                rows.append(x)
        at._gate(rows, floor)
        rows.sort(key=at._order)
        done.append((task, length, rows))
    at.adjust_family((rows for *_, rows in done), "holm")
    return done


def _informative(done: list[tuple]) -> list[tuple]:
    return [(t, n, x) for t, n, rows in done for x in rows
            if x["cmp"] is not None and not x["cmp"].get("uninformative")]  # fmt: skip


def sparsest_kept(done: list[tuple]) -> dict[str, dict | None]:
    """Per sparse method: walking its settings from the densest (mean density over the tasks
    that compare it), the last one before the first with a significant loss against ``full``
    after Holm on any task: ``{"setting", "density", "cmps": [(task, length, comparison)]}``;
    None when its densest setting already loses. Settings without a density or without an
    informative comparison are left out."""
    cmps = defaultdict(list)
    for t, n, x in _informative(done):
        cmps[(x["method"], x["label"])].append((t, n, x))
    by_method = defaultdict(list)
    for (method, label), found in cmps.items():
        dens = [x["density"] for _, _, x in found if x["density"] is not None]
        if len(dens) == len(found):
            lost = any(x["cmp"]["p_adj"] < at.ALPHA and x["cmp"]["diff"] < 0 for *_, x in found)
            by_method[method].append((sum(dens) / len(dens), label, lost, found))
    out = {}
    for method, pts in sorted(by_method.items(), key=lambda kv: at._rank(kv[0])):
        kept = None
        for d, _, lost, found in sorted(pts, key=lambda p: (-p[0], p[1])):
            if lost:
                break
            kept = {"setting": _name(found[0][2]).removeprefix(method).strip(), "density": d,
                    "cmps": [(t, n, x["cmp"]) for t, n, x in found]}  # fmt: skip
        out[method] = kept
    return out


def _kept_text(method: str, k: dict | None) -> str:
    if k is None:
        return f"{method}: none (its densest setting already loses)"
    diffs = ", ".join(f"{t} {100 * c['diff']:+.1f}" for t, _, c in k["cmps"])
    return f"{method} {k['setting']} (mean density {k['density']:.3f}; vs full: {diffs} points)"


def summary(done: list[tuple], floor: float) -> str:
    """The page's "what this page shows" line, from its tests only."""
    cmps = _informative(done)
    if not any(x["ref"] for *_, rows in done for x in rows):
        return (
            "**What this page shows** (generated): no `full` record holds these tasks: no "
            "comparison, no claim."
        )
    sig = [f"{_name(x)} on {at._where(t, n)} ({100 * x['cmp']['diff']:+.1f} points)"
           for t, n, x in cmps if x["cmp"]["p_adj"] < at.ALPHA]  # fmt: skip
    text = (f"**What this page shows** (generated): {len(sig)} of the {len(cmps)} informative "
            f"comparisons against `full` {'is' if len(sig) == 1 else 'are'} significant after "
            "Holm" + (f": {'; '.join(sig)}." if sig else "."))  # fmt: skip
    gated = [
        at._where(t, n)
        for t, n, rows in done
        if any(x["cmp"] is not None and x["cmp"].get("uninformative") for x in rows)
    ]
    if gated:
        text += (f" {len(gated)} task{'s are' if len(gated) > 1 else ' is'} uninformative "
                 f"(`full` below {floor:g}%): {'; '.join(gated)}.")  # fmt: skip
    kept = sparsest_kept(done)
    if kept:
        parts = [_kept_text(m, k) for m, k in kept.items()]
        text += (
            " Sparsest setting per method with no significant loss on any task, every "
            "denser setting of the method without one either (not significant is not "
            f"equivalent: see the MDD column): {'; '.join(parts)}."
        )
    return text


def _name(x: dict) -> str:
    return x["label"] + (" (default)" if x.get("default") else "")


def _setting_text(x: dict) -> str:
    if x["ref"]:
        return "-"
    return x["setting"] + (" (default)" if x.get("default") else "")


def page(recs: list[dict], done: list[tuple], missing: list[dict], planned: int,
         floor: float, experiment: str = EXPERIMENT, fig: str | None = None) -> str:  # fmt: skip
    """The fronts page: header (model, device, code, n, gate, family), the generated summary,
    one table per task, the missing points."""
    model = recs[0]["config"]["model"]
    bench = recs[0]["metrics"]["benchmark"]
    devices = defaultdict(int)
    for r in recs:
        devices[device_label(r["environment"])] += 1
    revs = sorted({r["environment"].get("git_revision") or r["identity"].get("code") or "?"
                   for r in recs})  # fmt: skip
    ns = sorted({x["n"] for *_, rows in done for x in rows})
    family = _informative(done)
    unknown = sorted({p["method"] for p in missing + [r["_point"] for r in recs if r["_point"]]
                      if p["default"] is None}, key=at._rank)  # fmt: skip
    out = [
        f"# Accuracy-vs-density fronts: {bench}, {model['name']} ({at.weights(model)})",
        "",
        "Generated by `python analysis/make_all.py` (`analysis/fronts.py`) from the records pinned "
        f"under `records.fronts.{model['name']}` in `results/manifest.yaml`; do not edit by hand. "
        f"Experiment: `conf/experiment/{experiment}.yaml` ({len(recs)} of its {planned} sweep "
        "points have a pinned record; the others are listed at the end). These records are not in "
        "the model's accuracy table: their comparisons form this page's own family.",
        "",
        f"- Device: {'; '.join(f'{d} ({k} records)' for d, k in sorted(devices.items()))}.",
        f"- Code revision{'s' * (len(revs) > 1)}: {', '.join(revs)}.",
        f"- n per task and setting: {', '.join(map(str, ns))}.",
        f"- Capability gate: a task where `full` scores below {floor:g}% (`dense_floor`, "
        "`analysis/settings.yaml`) is uninformative: no claim, out of the family.",
        f"- Tests: each setting against `full` on the same sample ids (paired): the difference "
        "with its 95% paired interval (Tango's score interval for 0/1 scores, the sign-flip test "
        "inverted for graded ones), McNemar's exact test (0/1 scores, discordant pairs n10/n01) "
        "or a sign-flip permutation test (graded scores); `eval/significance.py`. Family: the "
        f"{len(family)} informative comparisons against `full` on this page (every setting, "
        "every task); p Holm: Holm-adjusted over that family; not significant: adjusted p >= "
        f"{at.ALPHA}. MDD: the smallest difference (pts) these n pairs detect with "
        f"{at.POWER:.0%} power at two-sided {at.ALPHA}, before adjustment.",
        "- Default settings (`conf/config.yaml`, `conf/method/<method>.yaml`) are marked "
        '"(default)"'
        + (
            f"; not known from `conf/` for {', '.join(unknown)} (a resolver of the "
            "model sets it), left unmarked."
            if unknown
            else "."
        ),
        "",
        summary(done, floor),
    ]
    if fig:
        out += ["", f"![{fig}]({fig})"]
    head = ["method", "knob setting", "density", "acc % [95% CI]", "n", "vs full (pts)",
            "95% CI (pts)", "paired test", "p", "p Holm", "MDD (pts)", "verdict"]  # fmt: skip
    for task, length, rows in done:
        out += ["", f"## {task}, length {at._f(length, 'd')}", "", at.recipe_text(bench, task), ""]
        cells = []
        for x in rows:
            cmp = ["(reference)"] + [""] * 6 if x["ref"] else at._cmp_text(x["cmp"])
            cells.append(
                [
                    x["method"],
                    _setting_text(x),
                    at._f(x["density"], ".3f"),
                    f"{x['acc']:.1f} [{x['lo']:.1f}, {x['hi']:.1f}]",
                    str(x["n"]),
                    *cmp,
                ]
            )
        out.append(markdown(pd.DataFrame(cells, columns=head)))
    out += ["", "## Sweep points without a pinned record", ""]
    if missing:
        for method, pts in _by_method(missing):
            out.append(f"- {method}: {', '.join(_point_text(p) for p in pts)}.")
        out += ["", f"Produced by: {COMMAND}."]
    else:
        out.append("None: every sweep point has a pinned record.")
    return "\n".join(out) + "\n"


def _point_text(p: dict) -> str:
    return p["label"] + (" (default)" if p["default"] else "")


def _by_method(points: list[dict]) -> list[tuple[str, list[dict]]]:
    by = defaultdict(list)
    for p in points:
        by[p["method"]].append(p)
    return sorted(by.items(), key=lambda kv: at._rank(kv[0]))


def series(rows: list[dict]) -> dict[str, list[dict]]:
    """A task's figure lines: per sparse method (``accuracy_tables.ORDER``), its rows with a
    density, ordered by density (the line runs through them in this order)."""
    out = {}
    for method in sorted({x["method"] for x in rows if not x["ref"]}, key=at._rank):
        pts = [x for x in rows if x["method"] == method and x["density"] is not None]
        if pts:
            out[method] = sorted(pts, key=lambda x: (x["density"], x["label"]))
    return out


def figure(recs: list[dict], done: list[tuple], out: Path) -> Path:
    """One panel per task: accuracy (95% interval bars) against mean density, one line per
    sparse method through its settings ordered by density, the default setting a star, a
    setting off the main knob's series hollow; ``full`` a dashed line with its interval as a
    band."""
    from analysis.plotting import save, setup

    plt = setup()
    from matplotlib.lines import Line2D

    ncol = len(done)
    fig, axes = plt.subplots(1, ncol, figsize=(4.6 * ncol, 3.8), squeeze=False)
    handles = {}
    for ax, (task, length, rows) in zip(axes.flat, done):
        ref = next((x for x in rows if x["ref"]), None)
        if ref is not None:
            ax.axhspan(ref["lo"], ref["hi"], color="0.5", alpha=0.15, lw=0)
            handles["full (density 1), its 95% CI a band"] = ax.axhline(
                ref["acc"], color="0.3", lw=1.2, ls="--")  # fmt: skip
        for method, pts in series(rows).items():
            color = f"C{at._rank(method)}"
            dx, dy = [x["density"] for x in pts], [x["acc"] for x in pts]
            err = [[max(0.0, x["acc"] - x["lo"]) for x in pts],
                   [max(0.0, x["hi"] - x["acc"]) for x in pts]]  # fmt: skip
            ax.errorbar(dx, dy, yerr=err, fmt="none", ecolor=color, elinewidth=0.8, capsize=2,
                        alpha=0.6)  # fmt: skip
            handles[method] = ax.plot(dx, dy, "-", color=color, lw=1.2)[0]
            main = [x for x in pts if _on_main(x)]
            off = [x for x in pts if not _on_main(x)]
            ax.plot([x["density"] for x in main], [x["acc"] for x in main], "o", color=color,
                    ms=4)  # fmt: skip
            if off:
                ax.plot([x["density"] for x in off], [x["acc"] for x in off], "s", ms=5,
                        mfc="white", mec=color, mew=1.2)  # fmt: skip
                handles[OFF_MAIN] = Line2D([], [], ls="none", marker="s", ms=5, mfc="white",
                                           mec="0.3", mew=1.2)  # fmt: skip
            for x in pts:
                if x.get("default"):
                    ax.plot(x["density"], x["acc"], "*", ms=13, color=color, mec="black",
                            mew=0.8, zorder=5)  # fmt: skip
                    handles["default setting"] = Line2D(
                        [], [], ls="none", marker="*", ms=13, color="0.75", mec="black", mew=0.8
                    )
        n = max(x["n"] for x in rows)
        ax.set_title(f"{task}, {at._f(length, 'd')} tokens (n={n})")
        ax.set_xlabel("mean prefill density")
        ax.set_ylabel("accuracy % (95% CI)")
        right = max((x["density"] for x in rows if not x["ref"] and x["density"] is not None),
                    default=0.95)  # fmt: skip
        ax.set(xlim=(0, min(1.02, math.ceil(10 * right + 0.5) / 10)), ylim=(-4, 104))
        ax.grid(alpha=0.3)
    names = [m for m in at.ORDER if m in handles] + [k for k in handles if k not in at.ORDER]
    fig.legend([handles[k] for k in names], names, loc="lower center", ncol=min(4, len(names)),
               frameon=False)  # fmt: skip
    model = recs[0]["config"]["model"]["name"]
    fig.suptitle(f"{recs[0]['metrics']['benchmark']}, {model}: accuracy-vs-density fronts")
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(names) - 1) // 4), 1, 1))
    save(fig, out)
    return out


OFF_MAIN = "a knob besides the main one off its default (hollow)"


def _on_main(x: dict) -> bool:
    """Whether a row's setting moves only its method's main knob (the series' own axis)."""
    main = at.MAIN_KNOB.get(x["method"])
    names = [part.split("=")[0] for part in x["setting"].split() if "=" in part]
    return names == [main] or not names


def pinned(manifest: dict, model: str = MODEL) -> list[str]:
    """The record paths (relative to results/) of ``records.fronts.<model>``."""
    return list((((manifest.get("records") or {}).get("fronts") or {}).get(model)) or [])


def build(results: Path, out: Path, manifest: dict, conf: Path = CONF,
          experiment: str = EXPERIMENT, model: str = MODEL) -> Section:  # fmt: skip
    """The section, the page and the figure; a pinned record that is absent or unreadable is a
    missing-records line, the others still make the page."""
    sec = Section(
        "fronts",
        "Accuracy-vs-density fronts: Qwen2.5-Coder-1.5B-Instruct, RULER at 32K",
        "none (issue 34: each method along its main knob; the paper reports one setting per "
        "method)",
    )
    recs = []
    for rel in pinned(manifest, model):
        path = Path(results) / rel
        try:
            recs.append(at.load(path))
            sec.sources.append(f"`results/{rel}`")
        except (OSError, ValueError, KeyError, SystemExit) as exc:
            why = "not found" if not path.is_file() else f"unreadable: {exc}"
            sec.missing_line(f"the pinned fronts record `results/{rel}` ({why})",
                             f"re-pin `records.fronts.{model}` in `results/{MANIFEST}`, or "
                             + COMMAND)  # fmt: skip
    exp_file = conf / "experiment" / f"{experiment}.yaml"
    points = plan(exp_file, conf)
    if not recs:
        sec.missing_line(f"kind=accuracy records of `experiment={experiment}` "
                         f"(records.fronts.{model})", COMMAND)  # fmt: skip
        return sec
    missing = match(recs, points)
    floor = at.dense_floor()
    done = _cells(recs, floor)
    stem = f"fronts_{model}"
    fig = figure(recs, done, out / f"{stem}.png")
    (out / f"{stem}.md").write_text(page(recs, done, missing, len(points), floor, experiment,
                                         fig.name))  # fmt: skip
    sec.files += [f"{stem}.md", fig.name]
    stray = [r["_label"] for r in recs if r["_point"] is None]
    sec.body += [
        f"Each method along its main knob (`conf/experiment/{experiment}.yaml`: {len(points)} "
        f"sweep points, {len(recs)} with a pinned record), one line per method through its "
        "settings ordered by density, its default marked; every setting's paired comparison "
        "with `full`, Holm-adjusted over this page's own family (apart from the accuracy "
        f"table's). Every task's table, the header (device, code, n, gate) and the points still "
        f"missing: [`{stem}.md`]({stem}.md).",
        "",
        summary(done, floor),
    ]
    if stray:
        sec.body += ["", f"Pinned records that no sweep point of `{experiment}` makes: "
                     f"{', '.join(stray)}."]  # fmt: skip
    for method, pts in _by_method(missing):
        sec.missing_line(f"{method}'s fronts points {', '.join(_point_text(p) for p in pts)} "
                         f"({len(pts)} of {sum(p['method'] == method for p in points)})",
                         COMMAND)  # fmt: skip
    return sec


def section(ctx: Ctx) -> Section:
    return build(ctx.results, ctx.out, ctx.manifest)


def main(argv: list[str] | None = None) -> Section:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--out", type=Path, default=None, help="default: <results>/figures")
    args = ap.parse_args(argv)
    out = args.out or args.results / "figures"
    out.mkdir(parents=True, exist_ok=True)
    manifest = yaml.safe_load((args.results / MANIFEST).read_text()) or {}
    sec = build(args.results, out, manifest)
    print("\n".join(f"{out / f}" for f in sec.files) or "\n".join(sec.missing))
    return sec


if __name__ == "__main__":
    main()
