"""The retrieval diagnosis page: what S2O keeps and loses on RULER's needle tasks, and why, from
kind=accuracy records made with ``benchmark.evidence=true`` (reads records and their samples
only; ``conf/experiment/accuracy_retrieval_qwen_niah.yaml`` makes them).

    python analysis/retrieval_diagnosis.py                       # the records pinned in
                                                                 # results/manifest.yaml
    python analysis/retrieval_diagnosis.py --root results/accuracy/ruler/qwen25_coder_1p5b
    python analysis/retrieval_diagnosis.py REC.json [...] --out page.md --fig fig.png

Sections: (1) accuracy per task and length, every method on the same samples, with exact McNemar
tests against dense and against FlexPrefill, Holm-adjusted over the page's family (every test on
the page); (2) evidence recall (``eval/evidence.py``) on the samples each method kept and lost;
(3) where S2O's default loses the needle, in the heads that read it: the share of the evidence
mass kept, how far the question's query tiles walked, and where the needle ranked in the
segment-mean order that Step 1 uses and in the question's own order; (4) our implementation
step by step against the paper's Algorithms 1-3. The figure: mean evidence recall per layer and
head, one panel per method.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from analysis.accuracy_tables import find, load
from analysis.records import SCRATCH, device_name, rel_path
from analysis.tables import markdown as _markdown
from eval.evidence import MIN_MASS
from eval.significance import adjust_p, paired_test
from s2o.methods.s2o import variants_on


def markdown(head: list[str], rows: list[list]) -> str:
    import pandas as pd

    return _markdown(pd.DataFrame(rows, columns=head))


READING_MASS = 0.1  # a (layer, head) "reads" the evidence when its dense mass there is >= this
METHOD_ORDER = ("full", "s2o", "flexprefill", "flashprefill", "xattn", "pbs")


def label(rec: dict) -> str:
    """``full``, ``s2o``, ``s2o dense_tail=128``, ``s2o tail_rank=128``, ``s2o
    step1_score_bits=16``, ``flexprefill`` (a knob off its default named)."""
    name = rec["metrics"]["method"]
    knobs = rec["metrics"].get("knobs") or {}
    extra = []
    if name == "s2o":
        extra += [f"{variant}={value}" for variant, value in variants_on(knobs).items()]
        if knobs.get("tau") not in (None, 0.005):
            extra.append(f"tau={knobs['tau']}")
        if knobs.get("segment_len") not in (None, 2048):
            extra.append(f"S={knobs['segment_len']}")
    return " ".join([name, *extra])


def _rank(lab: str) -> tuple:
    base = lab.split()[0]
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else 9, lab)


def by_label(recs: list[dict]) -> dict[str, dict]:
    out = {}
    for r in recs:
        lab = label(r)
        if lab in out:
            raise SystemExit(f"two records for {lab!r}: {out[lab]['_path']} and {r['_path']}")
        out[lab] = r
    return dict(sorted(out.items(), key=lambda kv: _rank(kv[0])))


def cells(recs: dict[str, dict]) -> list[tuple[str, int]]:
    keys = {(s["task"], s["length"]) for r in recs.values() for s in r["_samples"].values()}
    return sorted(keys, key=lambda k: (k[1], k[0]))


def _ids(rec: dict, task: str, length: int) -> dict[str, dict]:
    return {i: s for i, s in rec["_samples"].items() if s["task"] == task and s["length"] == length}


def summary(rows: list[dict]) -> list[str]:
    """One generated sentence per (task, length) and record other than the references (S2O, its
    named variants, a further baseline such as FlashPrefill), the pooled tasks of each length
    first: what it answered, at which density, against dense attention, FlexPrefill and (for a
    named variant) S2O's default on the same samples (won/lost; exact McNemar, or the sign-flip
    test where scores are fractional; Holm-adjusted within the per-task or the pooled family).
    README.md and docs/accuracy.md quote these lines, never their own numbers."""
    out = []
    for r in sorted(rows, key=lambda x: (x["task"] != "all", x["length"])):
        if r["method"] in REFERENCES:  # dense attention and FlexPrefill are the references
            continue
        cell = [x for x in rows if x["task"] == r["task"] and x["length"] == r["length"]]
        parts = []
        for ref, name in COMPARED.items():
            t, other = r.get(f"vs_{ref}"), next((x for x in cell if x["method"] == ref), None)
            if t and other:
                dens = "" if other["density"] is None else f" at density {other['density']:.3f}"
                parts.append(
                    f"{name} {other['correct']:g}/{other['n']}{dens} (won {t['n10']}, lost "
                    f"{t['n01']}; Holm p = {t['p_holm']:.2g})"
                )
        dens = "-" if r["density"] is None else f"{r['density']:.3f}"
        k = len({x["task"] for x in rows if x["length"] == r["length"]} - {"all"})
        what = f"{k} task{'s' * (k != 1)} pooled" if r["task"] == "all" else r["task"]
        out.append(
            f"{what} at {r['length']} tokens: {r['method']} answered "
            f"{r['correct']:g}/{r['n']} at density {dens}"
            + ("; " + ", ".join(parts) if parts else "")
            + "."
        )
    return out


def accuracy_rows(recs: dict[str, dict]) -> list[dict]:
    """One row per (length, task incl. ``all``, method) with its tests (p unadjusted here)."""
    rows = []
    lengths = sorted({length for _, length in cells(recs)})
    for length in lengths:
        tasks = sorted({t for t, n in cells(recs) if n == length}) + ["all"]
        for task in tasks:
            per = {}
            for lab, rec in recs.items():
                ss = {i: s for i, s in rec["_samples"].items() if s["length"] == length
                      and (task == "all" or s["task"] == task)}  # fmt: skip
                if ss:
                    per[lab] = ss
            common = set.intersection(*(set(s) for s in per.values())) if per else set()
            ids = sorted(common)
            for lab, ss in per.items():
                scores = [float(ss[i]["score"]) for i in ids]
                dens = [ss[i]["density"] for i in ids if ss[i].get("density") is not None]
                rec_ev = [_recall(ss[i]) for i in ids]
                row = {"length": length, "task": task, "method": lab, "n": len(ids),
                       "correct": sum(scores), "density": _mean(dens),
                       "recall": _mean(rec_ev)}  # fmt: skip
                for ref in COMPARED:
                    if ref in per and _compares(lab, ref):
                        b = [float(per[ref][i]["score"]) for i in ids]
                        row[f"vs_{ref}"] = paired_test(scores, b)
                rows.append(row)
    for pooled in (False, True):  # two families: the per-task rows, the pooled (`all`) rows
        family = [(i, ref) for i, r in enumerate(rows) for ref in COMPARED
                  if f"vs_{ref}" in r and (r["task"] == "all") == pooled]  # fmt: skip
        adj = adjust_p([rows[i][f"vs_{ref}"]["p_value"] for i, ref in family], "holm")
        for (i, ref), p in zip(family, adj):
            rows[i][f"vs_{ref}"]["p_holm"] = p
    return rows


TEST_NAME = {"mcnemar_exact": "exact McNemar", "sign_flip_exact": "sign-flip test",
             "sign_flip_mc": "sign-flip test"}  # fmt: skip


def _compares(lab: str, ref: str) -> bool:
    """Whether row ``lab`` gets a test against ``ref``: dense and FlexPrefill for every other
    method, S2O's default for S2O's named variants. Dense's own row gets none: its test against
    FlexPrefill is FlexPrefill's against dense, counted once in the Holm family."""
    if lab == "full":
        return False
    if ref == "s2o":
        return lab.startswith("s2o ")
    return lab != ref and lab.split()[0] != ref


def _recall(sample: dict) -> float | None:
    return (sample.get("evidence") or {}).get("evidence_recall")


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _p(c: dict | None, key: str) -> str:
    if not c or key not in c:
        return "-"
    p = c[key]
    text = f"{p:.2g}" if p < 0.001 else f"{p:.3f}"
    # a Monte Carlo p at its floor (no resample as extreme) is a bound, not a value
    return f"<={text}" if key == "p_value" and p <= c.get("resolution", 0) * (1 + 1e-9) else text


def accuracy_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        cf, cx, cs = r.get("vs_full"), r.get("vs_flexprefill"), r.get("vs_s2o")
        diff = lambda c: "-" if not c else f"{c['n10']}/{c['n01']}"
        out.append([
            r["length"], r["task"], r["method"], f"{r['correct']:g}/{r['n']}",
            _f(r["density"], ".3f"), _f(r["recall"], ".3f"),
            diff(cf), _p(cf, "p_value"), _p(cf, "p_holm"),
            diff(cx), _p(cx, "p_value"), _p(cx, "p_holm"),
            diff(cs), _p(cs, "p_holm"),
        ])  # fmt: skip
    head = ["length", "task", "method", "correct", "density", "evidence recall",
            "vs dense: won/lost", "p", "p (Holm)",
            "vs FlexPrefill: won/lost", "p ", "p (Holm) ",
            "vs S2O default: won/lost", "p (Holm)  "]  # fmt: skip
    return markdown(head, out)


def lost_kept(recs: dict[str, dict]) -> list[list]:
    """Per sparse method and length: mean evidence recall on the samples dense got right that the
    method kept, and on those it lost."""
    out = []
    if "full" not in recs:
        return out
    full = recs["full"]["_samples"]
    for lab, rec in recs.items():
        if lab == "full":
            continue
        for length in sorted({s["length"] for s in rec["_samples"].values()}):
            kept, lost = [], []
            for i, s in rec["_samples"].items():
                f = full.get(i)
                ev = (s.get("evidence") or {}).get("evidence_recall")
                if s["length"] != length or f is None or ev is None or float(f["score"]) != 1.0:
                    continue
                (kept if float(s["score"]) == 1.0 else lost).append(ev)
            out.append([lab, length, len(kept), _f(_mean(kept), ".3f"), len(lost),
                        _f(_mean(lost), ".3f")])  # fmt: skip
    return out


def reading_heads(samples: list[dict]) -> dict[str, list[float]]:
    """Over the given samples' (layer, head) pairs whose dense evidence mass is at least
    :data:`READING_MASS`: recall, and S2O's walk share and the two rank shares."""
    got = defaultdict(list)
    for s in samples:
        ev = s.get("evidence") or {}
        mass = np.asarray(ev.get("mass") or [], dtype=float)
        if mass.size == 0:
            continue
        pick = mass >= READING_MASS
        got["pairs"].append(int(pick.sum()))
        rec = np.asarray(ev["recall"], dtype=float)
        got["recall"] += rec[pick].tolist()
        for key, vals in (ev.get("s2o") or {}).items():
            got[key] += np.asarray(vals, dtype=float)[pick].tolist()
    return got


def _median(xs) -> float | None:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.median(xs)) if xs else None


MIN_LOST = 5  # fewer lost samples than this: the page localizes nothing (medians of a few pairs)
REFERENCES = {"full": "dense attention", "flexprefill": "FlexPrefill"}
# a named S2O variant is also compared with S2O's default (the paper's method) on the same samples
COMPARED = {**REFERENCES, "s2o": "S2O's default"}


def localization(recs: dict[str, dict]) -> tuple[list[list], list[str]]:
    """Each S2O record on the samples a reference (dense attention, FlexPrefill) got right:
    those S2O kept and those it lost, in the reading heads. Row: ``[method, length, reference,
    group, n, pairs, recall, walk share, rank (segment mean), rank (question), beyond]``."""
    rows, notes = [], []
    for ref in REFERENCES:
        if ref not in recs:
            continue
        base = recs[ref]["_samples"]
        for lab, rec in recs.items():
            if lab.split()[0] != "s2o":
                continue
            for length in sorted({s["length"] for s in rec["_samples"].values()}):
                groups = {"kept": [], "lost": []}
                for i, s in rec["_samples"].items():
                    f = base.get(i)
                    if s["length"] != length or f is None or float(f["score"]) != 1.0:
                        continue
                    groups["kept" if float(s["score"]) == 1.0 else "lost"].append(s)
                for g, ss in groups.items():
                    h = reading_heads(ss)
                    if not h.get("recall"):
                        continue
                    beyond = [r > w for r, w in zip(h.get("rank_segment_mean", []),
                                                    h.get("walk_share", []))
                              if not (math.isnan(r) or math.isnan(w))]  # fmt: skip
                    rows.append([
                        lab, length, REFERENCES[ref], g, len(ss), len(h["recall"]),
                        _f(_median(h["recall"]), ".3f"),
                        _f(_median(h.get("walk_share", [])), ".3f"),
                        _f(_median(h.get("rank_segment_mean", [])), ".3f"),
                        _f(_median(h.get("rank_question_mean", [])), ".3f"),
                        _f(sum(beyond) / len(beyond) if beyond else None, ".2f"),
                    ])  # fmt: skip
    return rows, notes


LOCALIZATION_HEAD = ["method", "length", "answered by", "S2O", "n", "pairs", "recall",
                     "walk share", "rank (segment mean)", "rank (question)",
                     "rank beyond walk"]  # fmt: skip


def verdict(loc_rows: list[list]) -> str:
    """Generated paragraphs from S2O default's "lost" rows, one per reference and length (no
    number typed by hand); a group of fewer than :data:`MIN_LOST` samples is not interpreted."""
    lost = [r for r in loc_rows if r[0] == "s2o" and r[3] == "lost"]
    if not lost:
        return "No sample that a reference answered was lost by S2O's default here."
    out = []
    for r in lost:
        _, length, ref, _, n, pairs, rec, walk, r_seg, r_q, beyond = r
        text = (
            f"At {length} tokens, on the {n} samples {ref} answered and S2O's default lost, the "
            f"{pairs} reading (layer, head) pairs kept a median {rec} of the evidence mass; the "
            f"question's query tiles walked a median {walk} of their ranked prefix, while the "
            f"needle key they read most sat at a median rank share {r_seg} in Step 1's "
            f"segment-mean order (beyond the walked share in {beyond} of the pairs) and {r_q} in "
            "the question's own order."
        )
        if n < MIN_LOST:
            out.append(text + f" Too few samples (fewer than {MIN_LOST}) to say why.")
            continue
        try:
            rs, rq, w, kept = float(r_seg), float(r_q), float(walk), float(rec)
        except ValueError:
            out.append(text)
            continue
        if rs > w and rq < w:
            why = (
                "The needle is ranked late by the segment-mean query and early by the "
                "question's own query, and the walk stops before it: the loss comes from Step "
                "1's one ranking per segment (the question is a few dozen of its queries), "
                "which the early stop then makes final."
            )
        elif kept >= 0.9:
            why = (
                "The reading heads kept most of the evidence mass: the lost answers are not "
                "explained by the question rows missing the needle (what the rest of the prompt's "
                "rows computed, e.g. the haystack's other needles, is not measured here)."
            )
        elif rs <= w:
            why = (
                "The needle is ranked within the walked share, yet the reading heads lost "
                "evidence mass: look at the stop decisions per row."
            )
        else:
            why = "The needle ranks late in both orders: neither ranking would reach it early."
        out.append(text + " " + why)
    return "\n\n".join(out)


def recall_vs_accuracy(rows: list[dict]) -> str:
    """A generated sentence per cell where a method with higher evidence recall answered
    significantly fewer samples (Holm p < 0.05) than one with lower recall: the question rows'
    recall does not order the methods' accuracy there."""
    out, seen = [], set()
    for r in rows:
        for ref in REFERENCES:
            pair = (r["length"], r["task"], frozenset((r["method"], ref)))
            if pair in seen:
                continue
            t = r.get(f"vs_{ref}")
            other = next((x for x in rows if x["method"] == ref and x["length"] == r["length"]
                          and x["task"] == r["task"]), None)  # fmt: skip
            if not t or other is None or r["task"] == "all" or t.get("p_holm", 1) >= 0.05:
                continue
            if None in (r["recall"], other["recall"]):
                continue
            seen.add(pair)
            gains = t["n10"] > t["n01"]
            hi, lo = (other, r) if gains else (r, other)
            if hi["recall"] > lo["recall"]:
                out.append(
                    f"{r['task']} at {r['length']}: {lo['method']} answered "
                    f"{lo['correct']:g}/{lo['n']} at evidence recall {lo['recall']:.3f}, "
                    f"{hi['method']} {hi['correct']:g}/{hi['n']} at {hi['recall']:.3f} "
                    f"({TEST_NAME[t['test']]}, Holm p = {t['p_holm']:.2g}): the method that "
                    "computed more of "
                    "the question's attention to the needles answered fewer, so evidence recall "
                    "of the question rows does not explain this difference."
                )
    return "\n\n".join(out)


FIDELITY = [
    ["Alg. 1: segments of S tokens, q_mean and k_mean per segment", "yes",
     "s2o/reference.py s2o_permutations"],
    ["Alg. 1 (i): k_guide = k_mean[0]; Q_perm = argsort desc <Q_n[s], k_guide> per segment",
     "yes", "ties keep token order (stable sort)"],
    ["Alg. 1 (ii): KV_perm[n] = argsort desc <q_mean[n], K[t]> over the causal prefix t < nS",
     "yes", "with local_window W > 0 the prefix ends at nS - W (W = 0 by default, as printed)"],
    ["Alg. 2: Pass-1 dense causal attention inside each segment, states (acc, l, m) kept", "yes",
     "kernels keep o = acc / l in the input dtype (documented rounding)"],
    ["Alg. 3: Pass-2 walks KV_perm[n] in B_N tiles for the Q_perm-ordered query tiles",
     "yes", "B_M = B_N = 128"],
    ["Alg. 3: break when delta_l < tau * l", "yes, per tile",
     "a tile stops when no valid row of it gains (the paper does not say how rows combine; "
     "'any row gains' is the most permissive reading, so it walks at least as far as 'all' or "
     "'mean'); the triggering tile is added (paper's kernel, Appendix variant D)"],
]  # fmt: skip


def head_recall(ev: dict) -> np.ndarray:
    """A sample's recall per (layer, head), NaN where the recorded dense mass on the evidence is
    below ``eval.evidence.MIN_MASS`` (records made before that rule stored near-0 recalls for
    heads with almost no mass there, dense attention included)."""
    rec = np.asarray(ev["recall"], dtype=float)
    return np.where(np.asarray(ev["mass"], dtype=float) >= MIN_MASS, rec, np.nan)


def figure(recs: dict[str, dict], out: Path) -> Path | None:
    """Mean evidence recall per (layer, head), one panel per method (NaN where no mass)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for lab, rec in recs.items():
        evs = [s.get("evidence") or {} for s in rec["_samples"].values()]
        mats = [head_recall(e) for e in evs if e.get("recall")]
        if mats:
            with warnings.catch_warnings():  # a head with no defined recall stays NaN (blank)
                warnings.simplefilter("ignore", RuntimeWarning)
                panels.append((lab, np.nanmean(np.stack(mats), axis=0), len(mats)))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 4.2), squeeze=False)
    for ax, (lab, mat, n) in zip(axes[0], panels):
        im = ax.imshow(mat, aspect="auto", vmin=0, vmax=1, cmap="viridis", origin="lower")
        ax.set_title(f"{lab} (n={n})", fontsize=9)
        ax.set_xlabel("query head")
        ax.set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="evidence recall (mean)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def provenance(recs: dict[str, dict]) -> str:
    envs = {}
    for lab, r in recs.items():
        env = r.get("environment") or {}
        gpu = env.get("gpu") or (device_name(env) if "device_name" in env else env.get("device"))
        key = (str(gpu), str(env.get("transformers")), str(env.get("git_revision")))
        envs.setdefault(key, []).append(lab)
    lines = [f"- {', '.join(labs)}: device {g}, transformers {t}, code {rev}"
             for (g, t, rev), labs in envs.items()]  # fmt: skip
    return "\n".join(lines)


def kernel_rows(kernel_recs: list[dict]) -> list[list]:
    """One row per ``benchmarks.kernel_on_samples`` record: the S2O kernel against its fp32
    reference on the Q/K/V the model computed on samples dense attention answered and S2O lost."""
    rows = []
    for rec in kernel_recs:
        m, env = rec["metrics"], rec["environment"]
        per = m["rows"]
        gap = max(abs(r["density_kernel"] - r["density_reference"]) for r in per)
        rows.append([
            f"`{rec['id']}`", len({r["id"] for r in per}), len(per),
            _f(m["summary"]["max_rel_err"], ".4f"),
            _f(m["summary"]["max_rel_err_question_rows"], ".4f"),
            _f(m["summary"]["min_same_walk_share"], ".4f"), f"{gap:.1e}",
            f"{env.get('device_name')}, torch {env.get('torch')}, Triton {env.get('triton')}, "
            f"{env.get('git_revision')}",
        ])  # fmt: skip
    return rows


KERNEL_HEAD = ["record", "samples", "layer checks", "max rel. error", "on the question rows",
               "min. same-walk share", "max density gap", "device, versions, revision"]  # fmt: skip


def kernel_part(kernel_recs: list[dict]) -> list[str]:
    if not kernel_recs:
        return []
    return [
        "## The kernel against its reference on the lost samples",
        "",
        "`benchmarks.kernel_on_samples`: Qwen's Q/K/V at the listed layers on samples dense "
        "attention answered and S2O's default lost; the Triton kernel's output against the fp32 "
        "PyTorch reference (relative Frobenius error, all rows and the question's last 128 "
        "rows), the share of query tiles whose walk stopped at the same tile in both, and the "
        "largest density difference.",
        "",
        markdown(KERNEL_HEAD, kernel_rows(kernel_recs)),
        "",
        kernel_verdict(kernel_recs),
        "",
    ]


KERNEL_MATCH = {"max_rel_err": 0.01, "min_same_walk_share": 0.99}  # bf16 output, fp32 reference


def kernel_verdict(kernel_recs: list[dict]) -> str:
    worst_err = max(r["metrics"]["summary"]["max_rel_err"] for r in kernel_recs)
    worst_walk = min(r["metrics"]["summary"]["min_same_walk_share"] for r in kernel_recs)
    bound_err, bound_walk = KERNEL_MATCH["max_rel_err"], KERNEL_MATCH["min_same_walk_share"]
    if worst_err <= bound_err and worst_walk >= bound_walk:
        return (f"The kernel matches its reference on these samples (relative error at most "
                f"{worst_err:.4f}, at least {worst_walk:.1%} of query tiles stop where the "
                f"reference stops): the lost answers come from the rule the reference computes, "
                f"not from the kernel.")  # fmt: skip
    return (
        f"The kernel departs from its reference on these samples (relative error up to "
        f"{worst_err:.4f}, same-walk share down to {worst_walk:.1%}; bounds "
        f"{KERNEL_MATCH}): a kernel bug may take part in the lost answers."
    )


def page(recs: dict[str, dict], fig: Path | None, kernel_recs: list[dict] = ()) -> str:
    first = next(iter(recs.values()))
    model_cfg = (first.get("config") or {}).get("model") or {}
    model = model_cfg.get("name") or first["metrics"]["model"]
    rows = accuracy_rows(recs)
    loc, _ = localization(recs)
    parts = [
        f"# Retrieval diagnosis: {model}, RULER needle tasks",
        "",
        "Generated by `python analysis/make_all.py` (or `python analysis/retrieval_diagnosis.py`) "
        "from the records below; every "
        "number comes from them. Paired tests on the same samples: exact McNemar where both "
        "methods' scores are 0/1, else the exact sign-flip test (niah_multivalue scores the "
        "share of values found; Monte Carlo above 20 differing samples, p never below its "
        "resolution); won/lost: samples where this method scored above / below the reference. "
        "p (Holm): adjusted over every test of the per-task rows of this page; the `all` rows "
        "(the tasks of a length pooled) are a second family, adjusted among themselves. A "
        "named S2O variant is also tested against S2O's default. Evidence recall: the share "
        "of the question's dense attention mass on the asked needles that the method computed "
        "(`eval/evidence.py`), mean over samples.",
        "",
        "Records:",
        "",
        *[f"- `{rel_path(r['_path'])}` ({lab})" for lab, r in recs.items()],
        "",
        provenance(recs),
        "",
        "## Summary",
        "",
        *[f"- {line}" for line in summary(rows)],
        "",
        "## Accuracy, density and evidence recall",
        "",
        accuracy_table(rows),
        "",
        "## Evidence recall on the samples dense attention answered",
        "",
        markdown(["method", "length", "kept: n", "recall", "lost: n", "recall"], lost_kept(recs)),
        "",
        "## Where S2O loses the needle",
        "",
        f"Reading heads: (layer, head) pairs whose dense attention from the question puts at "
        f"least {READING_MASS} of its mass on the needles. Medians over those pairs. Walk "
        "share: walked / ranked key tiles of the question rows' query tiles. Rank shares: "
        "position of the needle key the head reads most in the ranked prefix (0 = first), in "
        "Step 1's segment-mean order and in the order of the question rows' own mean query.",
        "",
        markdown(LOCALIZATION_HEAD, loc),
        "",
        verdict(loc),
        "",
        *kernel_part(list(kernel_recs)),
        "## Evidence recall against accuracy",
        "",
        recall_vs_accuracy(rows)
        or "No significant accuracy difference runs against the "
        "evidence recall order on this page.",
        "",
        "## Our S2O against the paper's text",
        "",
        markdown(["paper", "ours matches", "note"], FIDELITY),
        "",
        "The kernels equal the reference on these rules (tests/test_kernels_interpreter.py, "
        "tests/test_kernels_gpu.py); `dense_tail` and `tail_rank` are named variants, not the "
        "paper's method (s2o/dense_tail.py, s2o/tail_rank.py).",
    ]
    if fig is not None:
        parts += [
            "",
            f"![evidence recall per layer and head]({fig.name})",
            "",
            "Per (layer, head): the mean over samples of that head's evidence recall, each head "
            "counted alike (heads whose question rows put less than "
            f"{MIN_MASS:g} of their mass on the needles are left out). The recall column above "
            "weights heads by their evidence mass instead, so a method can keep most of the mass "
            "while many light heads show low recall here.",
        ]
    return "\n".join(parts) + "\n"


MAIN_MODEL = "qwen25_coder_1p5b"  # its page is PAGE; another model's is page_name(model)


def _manifest(manifest: dict | None, results: Path | None) -> tuple[dict, Path]:
    import yaml

    from analysis.records import MANIFEST, ROOT

    results = ROOT / "results" if results is None else results
    man = manifest if manifest is not None else yaml.safe_load((results / MANIFEST).read_text())
    return man, results


def pinned(manifest: dict | None = None, results: Path | None = None,
           key: str = "retrieval", model: str = MAIN_MODEL) -> list[Path]:  # fmt: skip
    """The records pinned under ``records.<key>.<model>`` in results/manifest.yaml
    (``manifest``/``results``: an already-read manifest and its results folder; ``key``:
    ``retrieval`` or ``kernel_on_samples``)."""
    man, results = _manifest(manifest, results)
    paths = ((man.get("records") or {}).get(key) or {}).get(model) or []
    return [results / p for p in paths]


def pinned_models(manifest: dict | None = None, results: Path | None = None) -> list[str]:
    """The models with records pinned under ``records.retrieval``: the main model first."""
    man, _ = _manifest(manifest, results)
    models = list((man.get("records") or {}).get("retrieval") or {})
    return sorted(models, key=lambda m: (m != MAIN_MODEL, m))


PAGE = "retrieval_diagnosis.md"


def page_name(model: str) -> str:
    """The page of ``model``'s diagnosis: :data:`PAGE` for the main model."""
    return PAGE if model == MAIN_MODEL else f"retrieval_diagnosis_{model}.md"


GPU_COMMAND = (
    "`python run.py -m experiment=accuracy_retrieval_qwen_niah` on a GPU (analysis/gpu_runs.md)"
)


def section(ctx):
    """make_all's artifact: the main model's page and figure written beside the other artifacts
    (``results/figures/retrieval_diagnosis.{md,png}``) and its accuracy rows on the index page;
    every other model pinned under ``records.retrieval`` gets a page of its own
    (:func:`page_name`), linked with its summary lines."""
    from analysis.sections import Section

    sec = Section(
        "retrieval_diagnosis",
        "Retrieval diagnosis: S2O on RULER's needle tasks, Qwen2.5-Coder-1.5B (evidence recall)",
        "none (the paper reports RULER accuracy, not evidence recall; Sec. 3 and Algs. 1-3 "
        "for the fidelity table)",
    )
    paths = [p for p in pinned(ctx.manifest, ctx.results) if p.is_file()]
    if not paths:
        sec.missing_line("kind=accuracy records with benchmark.evidence=true on Qwen "
                         "(records.retrieval.qwen25_coder_1p5b)", GPU_COMMAND)  # fmt: skip
    else:
        recs, krecs = _write_page(ctx, sec, MAIN_MODEL, paths)
        rows = accuracy_rows(recs)
        sec.body += [
            f"The whole page, with evidence recall, where S2O loses the needle and the fidelity "
            f"table: [{PAGE}]({PAGE}). Its accuracy rows:",
            "",
            accuracy_table([r for r in rows if r["task"] != "all"]),
            "",
            *[f"- {line}" for line in summary(rows)],
        ]
        for variant in ("dense_tail", "tail_rank"):
            if not any(lab.startswith(f"s2o {variant}") for lab in recs):
                sec.missing_line(f"the named variant s2o {variant}=128 on the same samples",
                                 GPU_COMMAND)  # fmt: skip
        if not krecs:
            sec.missing_line("the S2O kernel against its reference on the lost samples "
                             "(records.kernel_on_samples.qwen25_coder_1p5b)",
                             "`python -m benchmarks.kernel_on_samples` "
                             "(analysis/gpu_runs.md)")  # fmt: skip
        if "flashprefill" not in recs:
            sec.missing_line("FlashPrefill (alpha 0.08, the official Qwen2 value) on the same "
                             "samples", GPU_COMMAND)  # fmt: skip
    for model in pinned_models(ctx.manifest, ctx.results):
        paths = [p for p in pinned(ctx.manifest, ctx.results, model=model) if p.is_file()]
        if model == MAIN_MODEL or not paths:
            continue
        recs, _ = _write_page(ctx, sec, model, paths)
        name = page_name(model)
        sec.body += ["", f"The same diagnosis on {model} ({_devices(recs)}): [{name}]({name}).",
                     "", *[f"- {line}" for line in summary(accuracy_rows(recs))]]  # fmt: skip
    return sec


def _devices(recs: dict[str, dict]) -> str:
    """Where the records ran, e.g. ``cpu`` or ``NVIDIA H100 80GB HBM3``."""
    names = sorted({device_name(r["environment"]) for r in recs.values()})
    return "records made on " + ", ".join(names)


def _write_page(ctx, sec, model: str, paths: list[Path]) -> tuple[dict, list[dict]]:
    """Write ``model``'s page and figure into ``ctx.out``; note them in ``sec``."""
    name = page_name(model)
    recs = by_label([load(p) for p in paths])
    fig = figure(recs, ctx.out / name.replace(".md", ".png"))
    kpaths = [p for p in pinned(ctx.manifest, ctx.results, "kernel_on_samples", model)
              if p.is_file()]  # fmt: skip
    krecs = [json.loads(p.read_text()) for p in kpaths]
    (ctx.out / name).write_text(page(recs, fig, krecs))
    sec.files += [name] + ([fig.name] if fig is not None else [])
    sec.sources += [f"`{rel_path(p)}`" for p in paths + kpaths]
    return recs, krecs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="*", type=Path)
    ap.add_argument("--root", type=Path)
    ap.add_argument("--out", type=Path, default=SCRATCH / "retrieval_diagnosis.md")
    ap.add_argument("--fig", type=Path, default=None)
    a = ap.parse_args(argv)
    paths = list(a.records) + (find(a.root) if a.root else [])
    if not paths:
        paths = pinned()
    if not paths:
        raise SystemExit("no records: give record paths, --root, or pin records.retrieval")
    recs = by_label([load(p) for p in paths])
    fig = figure(recs, a.fig or a.out.with_suffix(".png"))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(page(recs, fig))
    print(f"wrote {a.out}" + (f" and {fig}" if fig else ""))


if __name__ == "__main__":
    main()
