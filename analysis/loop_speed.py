"""Where an accuracy job's time goes, against issue 34's target for the loop: each sample's wall
time within ``TARGET`` x (its prefill + its decode). Reads kind=accuracy records and their samples
only (``experiments/accuracy.py`` writes the fields).

    python analysis/loop_speed.py                  # the accuracy records pinned in the manifest
    python analysis/loop_speed.py REC.json [...] [--out page.md]
    python analysis/loop_speed.py --root results/accuracy/ruler/qwen25_coder_1p5b

What a record holds, and so what the page can say:

- ``sample_ms`` on every line, and the record's ``metrics.timing``: the target is checked per cell
  (sum of sample_ms over sum of prefill_ms + decode_ms), and the job's time is split into the
  model load, sample building, each part of a sample and what lies between samples;
- ``loop_ms`` but no ``sample_ms`` (records made before the field existed): only the job's
  ``elapsed_s`` over its samples, which also holds the sample building and, when the job loaded
  the model, the load. No such record has a load time, so the page says which ones started where
  a job of the same process and model ended (:func:`follows`: the model was already loaded) and
  which may hold the load. Without the load, elapsed_s per sample bounds the mean sample time from
  above, so a bound within the target shows the target met;
- neither (records made with ``model.generate``): counted, not shown.

``prefill_ms`` is the plug-in's whole prefill forward (embeddings to logits; with
``benchmark.evidence=true`` the evidence probe inside it too) and ``decode_ms`` is ``loop_ms`` less
it (the decode forwards, the greedy picks and stop checks), so prefill + decode = loop. A job
with ``decode_batch`` > 1 decodes its samples together: each line's ``decode_ms`` is its share of
the batch's decode (the column "decode batch", shown when a job batched: the mean rows per
batch, 1 one at a time).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import pandas as pd

from analysis.records import alone_on_gpu, device_label, git_short, on_cpu, sharing
from analysis.tables import markdown
from experiments.records import sample_lines

TARGET = 1.25  # issue 34: per-sample time within 1.25x of (prefill + decode)
LOAD_TARGET_S = 15.0  # issue 34: a model load after the first (warm caches) under 15 s
FOLLOW_S = 3.0  # a job that starts this close to another's end (1 s time stamps) followed it
PARTS = {  # the timing block's parts of a sample outside the decode loop, as the page names them
    "evidence_probe_s_sum": "evidence probe (locate + summary)",
    "score_s_sum": "scoring",
}
GPU_COMMAND = "the loop benchmark of `analysis/gpu_runs.md` (GPU)"


def pinned(manifest: dict) -> list[str]:
    """Accuracy record paths (relative to results/) pinned under ``records.loop_speed``,
    ``records.retrieval.*`` and ``records.accuracy``, each once."""
    recs = manifest.get("records") or {}
    paths = list(recs.get("loop_speed") or [])
    for group in (recs.get("retrieval") or {}).values():
        paths += list(group or [])
    paths += list(recs.get("accuracy") or [])
    return list(dict.fromkeys(paths))


def load(path: Path) -> dict | None:
    """An ok kind=accuracy record with its sample lines (``_lines``), or None."""
    rec = json.loads(Path(path).read_text())
    if rec.get("status") != "ok" or rec.get("kind") != "accuracy":
        return None
    lines = []
    for raw in sample_lines(Path(path)):
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:  # the unterminated tail a kill left: not in the record
            break
    rec["_path"], rec["_lines"] = str(path), lines
    return rec


def kind_of(rec: dict) -> str:
    """``measured`` (sample_ms on every line), ``derived`` (loop_ms only) or ``pre_loop``."""
    lines = rec["_lines"]
    if lines and all(r.get("sample_ms") is not None for r in lines):
        return "measured"
    if lines and all(r.get("loop_ms") is not None for r in lines):
        return "derived"
    return "pre_loop"


def label(rec: dict) -> str:
    return f"{rec['metrics']['method']} `{rec['id']}`"


def _probe(rec: dict) -> str:
    """Whether the evidence probe ran (inside the prefill forward and around it)."""
    return "on" if (rec["config"].get("benchmark") or {}).get("evidence") else "off"


def _sum(lines: list[dict], key: str) -> float:
    return sum(r[key] for r in lines)


def _work_ms(r: dict) -> float:
    """prefill + decode of one line (the loop when the prefill was not timed)."""
    return r["loop_ms"] if r.get("decode_ms") is None else r["prefill_ms"] + r["decode_ms"]


def _verdict(ratio: float) -> str:
    return "met" if ratio <= TARGET else f"missed by {ratio / TARGET - 1:.0%}"


def _gpu(env: dict) -> str:
    """``alone`` (:func:`analysis.records.alone_on_gpu`), ``shared: ...``
    (:func:`analysis.records.sharing`), ``unknown`` (the record cannot tell), or ``none (CPU)``."""
    if on_cpu(env):
        return "none (CPU)"
    if s := sharing(env):
        return "shared: " + ", ".join(s)
    return "alone" if alone_on_gpu(env) else "unknown"


def cell_frame(recs: list[dict]) -> pd.DataFrame:
    """One row per (record, task, length) of the measured records: means per sample (ms), the
    ratio of the sums sample / (prefill + decode) and the worst sample's ratio."""
    rows = []
    for rec in recs:
        cells: dict[tuple, list[dict]] = {}
        for r in rec["_lines"]:
            cells.setdefault((r["task"], r["length"]), []).append(r)
        for (task, length), ls in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            n, work = len(ls), sum(_work_ms(r) for r in ls)
            ratio = _sum(ls, "sample_ms") / work
            steps = sum(r.get("decode_steps") or 0 for r in ls)
            decode = sum(r.get("decode_ms") or 0 for r in ls)
            rows.append({
                "model": rec["config"]["model"]["name"], "method": label(rec), "task": task,
                "length": length, "n": n, "evidence probe": _probe(rec),
                "decode batch": sum(r.get("decode_batch", 1) for r in ls) / n,
                "GPU": _gpu(rec["environment"]),
                "sample ms": _sum(ls, "sample_ms") / n, "loop ms": _sum(ls, "loop_ms") / n,
                "prefill ms": sum(r.get("prefill_ms") or 0 for r in ls) / n,
                "decode ms": decode / n, "decode steps": steps / n,
                "ms / decode step": decode / steps if steps else None,
                "outside loop ms": (_sum(ls, "sample_ms") - _sum(ls, "loop_ms")) / n,
                "sample / (prefill+decode)": ratio,
                "worst sample": max(r["sample_ms"] / _work_ms(r) for r in ls),
                f"target <= {TARGET}x": _verdict(ratio),
            })  # fmt: skip
    frame = pd.DataFrame(rows)
    if not frame.empty and (frame["decode batch"] == 1).all():  # shown where a job batched
        frame = frame.drop(columns="decode batch")
    return frame


def job_frame(recs: list[dict]) -> pd.DataFrame:
    """Where each measured job's wall time went (s), from its ``timing`` block and elapsed_s."""
    rows = []
    for rec in recs:
        t = rec["metrics"].get("timing")
        if not t:
            continue
        load = t["model_load_s"]
        in_sample = sum(t.get(k) or 0 for k in PARTS) + t["generate_one_s_sum"]
        rows.append({
            "method": label(rec), "samples run": t["samples_run"],
            "model load": load, "load reused": t["model_reused"],
            "sample building": t["build_samples_s"], "samples wall": t["samples_wall_s"],
            "prefill": t["prefill_s_sum"], "decode": t["decode_s_sum"],
            "tokenize + answer text": t["generate_one_s_sum"] - t["loop_s_sum"],
            **{name: t.get(k) for k, name in PARTS.items()},
            "rest of samples": t["sample_s_sum"] - in_sample,
            "between samples": t["samples_wall_s"] - t["sample_s_sum"],
            "rest of job": rec["elapsed_s"] - (load or 0) - t["build_samples_s"]
            - t["samples_wall_s"],
            "elapsed": rec["elapsed_s"],
        })  # fmt: skip
    return pd.DataFrame(rows)


def load_lines(recs: list[dict]) -> list[str]:
    """One generated line per job that loaded its model after the first load (its tokenizer read
    from the verified cache, so the caches were warm): the load time against
    :data:`LOAD_TARGET_S`, and how much of it the tokenizer took."""
    out = []
    for rec in recs:
        t = rec["metrics"].get("timing") or {}
        tok = ((rec["metrics"].get("tokenizer") or {}).get("verified")) or {}
        if t.get("model_load_s") is None or t.get("model_reused") or not tok.get("cached"):
            continue
        load = t["model_load_s"]
        verdict = "met" if load < LOAD_TARGET_S else f"missed by {load / LOAD_TARGET_S:.1f}x"
        out.append(
            f"- {label(rec)}: model load after the first (tokenizer from the cache in "
            f"{tok.get('load_s', float('nan')):.1f} s) took {load:.1f} s; target under "
            f"{LOAD_TARGET_S:g} s: {verdict}."
        )
    return out


def _batched(rec: dict) -> bool:
    return any(r.get("decode_batch", 1) > 1 for r in rec["_lines"])


def _twin_key(rec: dict) -> tuple[str, str | None]:
    """A record's config identity with ``decode_batch`` at 1, and its weights."""
    from experiments.records import config_id, drop_for

    cfg = dict(rec["config"], decode_batch=1)
    env = rec["environment"]
    return config_id(cfg, drop_for("accuracy"), env.get("device_name")), (
        rec.get("identity") or {}
    ).get("model")


def agreement_pairs(recs: list[dict]) -> list[dict]:
    """Each record that decoded in batches (``decode_batch`` > 1) with each twin among ``recs``
    decoded one at a time (the same config but ``decode_batch``): on how many of their common
    samples the prediction and the score are the same."""
    out = []
    batched = [r for r in recs if _batched(r)]
    if not batched:
        return out
    singles = [(r, _twin_key(r)) for r in recs if not _batched(r)]  # each key computed once
    for rec in batched:
        key = _twin_key(rec)
        for twin in (t for t, k in singles if k == key):
            mine = {r["id"]: r for r in rec["_lines"]}
            common = [(mine[r["id"]], r) for r in twin["_lines"] if r["id"] in mine]
            if not common:
                continue
            out.append(
                {
                    "batched": rec,
                    "twin": twin,
                    "common": len(common),
                    "same_prediction": sum(a["prediction"] == b["prediction"] for a, b in common),
                    "same_score": sum(a["score"] == b["score"] for a, b in common),
                    "rows": sum(r.get("decode_batch", 1) for r in rec["_lines"])
                    / len(rec["_lines"]),
                }
            )
    return out


def batch_agreement(recs: list[dict], pairs: list[dict] | None = None) -> list[str]:
    """One generated line per pair of :func:`agreement_pairs` (``pairs``: already computed)."""
    return [
        f"- {label(p['batched'])} (decode_batch {p['batched']['config'].get('decode_batch')}, "
        f"{p['rows']:.1f} rows a batch on the mean) against {label(p['twin'])} (one at a time): "
        f"the same prediction on {p['same_prediction']} of {p['common']} common samples, the same "
        f"score on {p['same_score']}."
        for p in (agreement_pairs(recs) if pairs is None else pairs)
    ]


def agrees(recs: list[dict], at_least: float) -> bool:
    """Whether batched decoding may replace one-at-a-time decoding on this evidence: at least one
    batched record has a twin, and every pair gives the same prediction on at least ``at_least``
    of its common samples. Prints one line per pair."""
    pairs = agreement_pairs(recs)
    for line in batch_agreement(recs, pairs):
        print(line)
    if not pairs:
        print("no record decoded in batches has a twin decoded one at a time among these")
        return False
    return all(p["same_prediction"] >= at_least * p["common"] for p in pairs)


def _start(rec: dict) -> dt.datetime:
    return dt.datetime.fromisoformat(rec["environment"]["time"])


def follows(rec: dict, recs: list[dict]) -> dict | None:
    """The record whose job ended where ``rec``'s started, on the same host, device and model
    config (an earlier job of the same process: ``rec``'s job found the model loaded), or None."""
    where = lambda r: (r["environment"].get("hostname"), r["environment"].get("device"),
                       json.dumps(r["config"]["model"], sort_keys=True))  # fmt: skip
    for p in recs:
        if p is rec or where(p) != where(rec):
            continue
        after = (_start(rec) - _start(p)).total_seconds()
        if after > 0 and abs(after - p["elapsed_s"]) <= FOLLOW_S:
            return p
    return None


def derived_frame(recs: list[dict], pool: list[dict]) -> pd.DataFrame:
    """The records without sample_ms: elapsed_s per sample against their mean prefill + decode,
    and what elapsed_s holds (``pool``: every record read, for :func:`follows`)."""
    rows = []
    for rec in recs:
        ls, m = rec["_lines"], rec["metrics"]
        n, work = len(ls), sum(_work_ms(r) for r in ls) / len(ls)
        per = 1e3 * rec["elapsed_s"] / n
        steps = sum(r.get("decode_steps") or 0 for r in ls)
        decode = sum(r.get("decode_ms") or 0 for r in ls)
        prev = follows(rec, pool)
        if m.get("resumed"):
            holds, verdict = f"only the {n - m['resumed']} samples not resumed", "not checkable"
        elif prev is not None:
            holds = f"no model load (its job started where {label(prev)}'s ended)"
            verdict = (f"mean met (bound {per / work:.2f}x)" if per / work <= TARGET
                       else "not checkable (bound above the target)")  # fmt: skip
        else:
            holds = "the model load, unless an earlier job of its process (not read here) did it"
            verdict = "not checkable (load inside)"
        rows.append({
            "model": rec["config"]["model"]["name"], "method": label(rec),
            "device": device_label(rec["environment"]),
            "git": git_short(rec["environment"]), "n": n,
            "evidence probe": _probe(rec),
            "elapsed s": rec["elapsed_s"], "elapsed_s holds": holds,
            "elapsed / sample ms": per, "loop ms": _sum(ls, "loop_ms") / n,
            "prefill ms": sum(r.get("prefill_ms") or 0 for r in ls) / n,
            "decode ms": decode / n, "ms / decode step": decode / steps if steps else None,
            "elapsed / sample / (prefill+decode)": per / work,
            "job outside loop / sample ms": per - _sum(ls, "loop_ms") / n,
            f"target <= {TARGET}x": verdict, "sample_ms": "missing",
        })  # fmt: skip
    return pd.DataFrame(rows)


FORMATS = {
    **{c: ".0f" for c in ("sample ms", "loop ms", "prefill ms", "decode ms", "outside loop ms",
                          "elapsed / sample ms", "job outside loop / sample ms")},  # fmt: skip
    "ms / decode step": ".1f", "decode steps": ".1f", "sample / (prefill+decode)": ".2f",
    "worst sample": ".2f", "elapsed / sample / (prefill+decode)": ".2f", "elapsed s": ".1f",
}  # fmt: skip
JOB_FORMATS = {c: ".2f" for c in ("model load", "sample building", "samples wall", "prefill",
                                  "decode", "tokenize + answer text", *PARTS.values(),
                                  "rest of samples", "between samples", "rest of job",
                                  "elapsed")}  # fmt: skip


def document(recs: list[dict], pre_loop: int = 0) -> str:
    """The page (markdown) for ``recs`` (loaded records of any kind); ``pre_loop``: further records
    already left out as made before the decode loop."""
    measured = [r for r in recs if kind_of(r) == "measured"]
    derived = [r for r in recs if kind_of(r) == "derived"]
    pre_loop += sum(kind_of(r) == "pre_loop" for r in recs)
    parts = [
        "## Accuracy loop speed: where a sample's time goes",
        "",
        f"Target (issue 34): each sample's time within {TARGET}x of its prefill + decode, for "
        "Qwen2.5-Coder-1.5B at 32K with all five methods. `prefill` is the plug-in's whole prefill "
        "forward (with `benchmark.evidence=true` the evidence probe inside it too), `decode` the "
        "rest of the decode loop (`loop_ms` = prefill + decode); a sample's time (`sample_ms`) "
        "adds its prompt tokenization, the evidence probe outside the forward, the answer text "
        "and scoring.",
        "",
        "### Per cell, measured (`sample_ms`)",
        "",
    ]
    if measured:
        cf = cell_frame(measured)
        met = (cf[f"target <= {TARGET}x"] == "met").sum()
        parts += [markdown(cf, FORMATS), "",
                  f"{met} of {len(cf)} cells meet the target (ratio of the sums over the cell's "
                  "samples; `worst sample`: the largest single sample's ratio).", ""]  # fmt: skip
        jf = job_frame(measured)
        if len(jf):
            parts += ["### Where each job's time went (s, from the record's `timing`)", "",
                      markdown(jf, JOB_FORMATS), "",
                      "`tokenize + answer text`: a sample's generate step less its loop (the "
                      "prompt's tokenization, decoding the new tokens, the prefill's statistics); "
                      "`rest of samples`: what no part names (building the line); `between "
                      "samples`: writing the line and the progress; `rest of job`: elapsed_s "
                      "less the load, the sample building and the samples (checks, the summary).",
                      ""]  # fmt: skip
        loads = load_lines(measured)
        if loads:
            parts += ["### Model load after the first", "", *loads, ""]
        same = batch_agreement(measured)
        if same:
            parts += ["### Batched decoding against one at a time", "", *same, "",
                      "A twin: the same config but `decode_batch` and the same weights. Greedy "
                      "tokens agree up to the numerics of a padded batch; on the CPU in fp32 they "
                      "are equal (tests/test_decode.py).", ""]  # fmt: skip
    else:
        parts += ["No record read here has `sample_ms` (all were made before the field existed): "
                  "the target is not checked from a measured per-sample time. Produced by: "
                  f"{GPU_COMMAND}.", ""]  # fmt: skip
    if derived:
        parts += [
            "### Records without `sample_ms`: what `elapsed_s` allows",
            "",
            markdown(derived_frame(derived, recs), FORMATS),
            "",
            "`elapsed_s` is the whole job (run.py's wall time: sample building and every "
            "sample's tokenization, evidence probe and scoring included); none of these records "
            "has a load time. Where it holds no load, elapsed / sample bounds the mean "
            "`sample_ms` from above, so a bound within the target means the target is met on "
            "the mean (no single sample's time is known); "
            "`job outside loop / sample`: elapsed / sample less the mean loop.",
            "",
        ]
    if pre_loop:
        parts += [f"{pre_loop} more accuracy records were made before the decode loop "
                  "(`model.generate`, no `loop_ms`): left out.", ""]  # fmt: skip
    return "\n".join(parts).rstrip() + "\n"


def read(paths: list[Path]) -> list[dict]:
    return [r for r in (load(p) for p in paths) if r is not None]


PAGE = "loop_speed.md"


def section(ctx):
    """make_all's artifact: ``loop_speed.md`` beside the other artifacts, and its tables."""
    from analysis.sections import Section

    sec = Section(
        "loop_speed",
        "Accuracy loop speed: per-sample time against prefill + decode",
        "none (the harness's speed, issue 34; not a paper artifact)",
    )
    found = [(p, load(ctx.results / p)) for p in pinned(ctx.manifest)
             if (ctx.results / p).is_file()]  # fmt: skip
    recs = [r for _, r in found if r is not None]
    shown = [p for p, r in found if r is not None and kind_of(r) != "pre_loop"]
    if not any(kind_of(r) == "measured" for r in recs):
        sec.missing_line("kind=accuracy records with `sample_ms` (records.loop_speed)", GPU_COMMAND)
    if not shown:
        return sec
    text = document(recs)
    (ctx.out / PAGE).write_text(text)
    sec.files.append(PAGE)
    sec.body += text.split("\n", 2)[2].rstrip().split("\n")
    sec.sources += [f"`results/{p}`" for p in shown]
    return sec


def main(argv: list[str] | None = None) -> None:
    import yaml

    from analysis.records import ROOT, SCRATCH

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("records", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, help="every record.json under this folder")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--out", type=Path, default=SCRATCH / PAGE)
    ap.add_argument(
        "--min-agreement",
        type=float,
        metavar="F",
        help="no page: exit 0 if every batched record gives its twin's prediction on at least a "
        "share F of their common samples (and one pair exists), else 1",
    )
    args = ap.parse_args(argv)
    if args.min_agreement is not None and not 0 < args.min_agreement <= 1:
        ap.error(f"--min-agreement={args.min_agreement} must be in (0, 1]")
    paths = list(args.records) + (sorted(args.root.rglob("record.json")) if args.root else [])
    if args.min_agreement is not None:
        raise SystemExit(0 if agrees(read(paths), args.min_agreement) else 1)
    if not paths:
        manifest = yaml.safe_load((args.results / "manifest.yaml").read_text()) or {}
        paths = [args.results / p for p in pinned(manifest) if (args.results / p).is_file()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(document(read(paths)))
    print(args.out)


if __name__ == "__main__":
    main()
