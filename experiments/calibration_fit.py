"""The calibration fit as a producer: the statistics of real captured attention (or, with
``--synthetic-target``, of the default generator), the synthetic generator's knobs fitted to them
(``eval/calibrate.py``: the statistics and the fit), a ``conf/data/`` file and the fit's record.

    PYTHONPATH=. S2O_CACHE=cache python -m experiments.calibration_fit --model smollm2_135m \\
        --L 4096 --out conf/data/synthetic_calibrated.yaml \\
        --record results/captures/calibration_fit.json

The record holds the targets, every head's statistics, the fit's trace, the fitted statistics and
each single draw's loss (``--report-seeds``) at the start and at the fit; the rules its readers
need (``stats``: the statistics fitted, ``eval.calibrate.STATS``; ``bounds``: the knobs' search
bounds, ``eval.calibrate.BOUNDS``); and its provenance (``git_revision`` from
:func:`experiments.provenance.git_revision`, ``environment`` from
:func:`experiments.provenance.environment`). It is written atomically by
:func:`experiments.records.write_record`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eval import calibrate as cal
from eval.synthetic import SyntheticSpec, synthetic_qkv

from .provenance import environment, git_revision
from .records import write_record

KIND = "calibration_fit"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2_135m", help="conf/model/<name>.yaml")
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--layers", type=int, nargs="*", default=None, help="default: capture_layers")
    ap.add_argument(
        "--fit-heads",
        type=int,
        nargs=2,
        default=(9, 3),
        metavar=("HQ", "HKV"),
        help="heads of one draw (default: a SmolLM2 layer's, the check's shape)",
    )
    ap.add_argument(
        "--fit-seeds",
        type=int,
        nargs="+",
        default=[100, 101, 102],
        help="draws whose heads are pooled per evaluation (default: three, none of "
        "the check's seeds 0-3)",
    )
    ap.add_argument(
        "--report-seeds",
        type=int,
        nargs="*",
        default=[0, 1, 2, 3],
        help="single draws whose loss the record gives for the start and the fitted knobs",
    )
    ap.add_argument(
        "--topic-balance",
        action="store_true",
        help="fit the generator with topic_balance (every topic the same number of regions)",
    )
    ap.add_argument("--max-evals", type=int, default=120)
    ap.add_argument(
        "--start",
        type=Path,
        default=None,
        help="a conf/data file whose knobs (those > 0) start the search (default: the defaults)",
    )
    ap.add_argument("--out", type=Path, default=Path("conf/data/synthetic_calibrated.yaml"))
    ap.add_argument("--record", type=Path, default=Path("results/captures/calibration_fit.json"))
    ap.add_argument(
        "--synthetic-target",
        action="store_true",
        help="target: the default generator's own statistics (a self-test, no model)",
    )
    ap.add_argument(
        "--rev",
        default=None,
        help="the code revision to record (default: $S2O_GIT_REV, else git HEAD)",
    )
    return ap


def target_stats(args: argparse.Namespace) -> tuple[list[dict], dict, int]:
    """``(per-head statistics, input description, head_dim)`` of the fit's target input."""
    if not args.synthetic_target:
        return cal.real_stats(args.model, args.L, args.layers)
    q, k, _ = synthetic_qkv(SyntheticSpec(L=args.L, heads_q=2, heads_kv=1, head_dim=64))
    return cal.layer_stats(q, k), {"synthetic": "eval/synthetic.py defaults", "L": args.L}, 64


def start_knobs(path: Path | None) -> dict | None:
    """The knobs (those > 0) of a ``conf/data`` file that start the search, else None."""
    if path is None:
        return None
    from omegaconf import OmegaConf

    conf = OmegaConf.load(path)
    return {k: conf[k] for k in cal.KNOBS if k in conf and conf[k] > 0}


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    per_head, info, D = target_stats(args)
    target, start = cal.median_stats(per_head), start_knobs(args.start)
    heads, seeds, report = tuple(args.fit_heads), tuple(args.fit_seeds), tuple(args.report_seeds)
    fixed = {"topic_balance": True} if args.topic_balance else {}
    knobs, fitted, trace = cal.fit(target, args.L, heads, D, args.max_evals, start, seeds, fixed)
    default = cal.synthetic_stats({}, args.L, heads[0], heads[1], D, seeds)
    per_draw = {
        "seeds": list(report),
        "start": cal.draw_losses(trace[0]["knobs"], target, args.L, heads, D, report),
        "fitted": cal.draw_losses(knobs, target, args.L, heads, D, report),
    }
    rec = {
        "kind": KIND, "status": "ok",
        "input": info, "L": args.L, "head_dim": D, "fit_heads": list(heads),
        "fit_seeds": list(seeds), "draw_losses": per_draw,
        "stats": list(cal.STATS), "bounds": {k: list(v) for k, v in cal.BOUNDS.items()},
        "target": target, "per_head": per_head, "knobs": knobs, "fitted_stats": fitted,
        "default_stats": default, "loss": cal.loss(fitted, target),
        "default_loss": cal.loss(default, target), "evals": len(trace), "trace": trace,
        "command": "python -m experiments.calibration_fit " + " ".join(argv),
        "git_revision": git_revision(args.rev), "environment": environment("cpu", args.rev),
        "start": start,
    }  # fmt: skip
    write_record(args.record, rec)
    source = info.get("model", info.get("synthetic"))
    meta = {"command": rec["command"], "git": rec["git_revision"], "record": str(args.record),
            "source": f"{source} on {info.get('text', '-')} at L={args.L}", "L": args.L,
            "D": D, "knobs": ", ".join(cal.KNOBS)}  # fmt: skip
    cal.write_conf(args.out, knobs, meta)
    print(json.dumps({"target": target, "fitted": fitted, "knobs": knobs}, indent=1))
    return rec


if __name__ == "__main__":
    main()
