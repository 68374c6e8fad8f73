"""Pin the records behind the published tables and figures, and rebuild them from the pins.

    python analysis/pin.py                  # rebuild results/figures/ from the pinned records
    python analysis/pin.py --latest         # re-pin: the newest ok record of every experiment
    python analysis/pin.py hparams_tau=experiments/hparams_tau/<id>/record.json   # re-pin one

The pins live in ``results/manifest.yaml`` (paths relative to ``--results``): ``experiments:`` (the
harness's sweep/matched records, re-pinned here) and ``records:`` (benchmark, time-to-first-token
and capture records, edited by hand). Re-pinning keeps ``records:`` as it is. Then it rebuilds
every artifact with ``analysis/make_all.py`` (``results/figures/``). The names that can be pinned
(:data:`EXPERIMENTS`) are read from ``conf/`` (``analysis.records.experiment_commands``): those of
the runs that write ``results/experiments/<name>/`` records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from analysis import make_all
from analysis.records import MANIFEST, experiment_commands, latest

# name -> the arguments of the command that makes its records (conf/experiment/, conf/scale/)
EXPERIMENTS = experiment_commands()
HEADER = """\
# The records behind the published tables and figures in results/figures/ (paths relative to
# results/). The analysis scripts read these records, never "the newest record": running an
# experiment, a dry run or an analysis script changes no published file. Re-pin explicitly:
#   python analysis/pin.py --latest            # the newest ok record of each experiment
#   python analysis/pin.py hparams_tau=experiments/hparams_tau/<id>/record.json
# `records:` pins the benchmark, time-to-first-token and capture records (edit by hand).
# pin.py rewrites this file (keeping `records:`); `python analysis/make_all.py` rebuilds
# results/figures/ (every table and figure, and its README.md) from these pins.
"""


def replace_block(text: str, key: str, value: dict) -> str:
    """``text`` (a YAML file) with its top-level ``key:`` block replaced by ``value`` (appended
    where there is none); every other line, comments included, as it was."""
    lines = text.splitlines(keepends=True)
    block = yaml.safe_dump({key: value}, sort_keys=False)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"{key}:"), None)
    if start is None:
        return text + ("" if not text or text.endswith("\n") else "\n") + block
    end = next((j for j in range(start + 1, len(lines))
                if lines[j].strip() and not lines[j][0].isspace() and not lines[j].startswith("#")),
               len(lines))  # fmt: skip
    return "".join(lines[:start]) + block + "".join(lines[end:])


def repin(results: Path, pins: dict, use_latest: bool, assignments: list[str]) -> dict:
    """New pins: the newest ok records (``use_latest``) and/or ``NAME=PATH`` assignments."""
    pins = dict(pins)
    if use_latest:
        for name in EXPERIMENTS:
            rec = latest(results, name)
            if rec is not None:
                pins[name] = str(Path(rec["_path"]).relative_to(results))
    for item in assignments:
        name, sep, rel = item.partition("=")
        if not sep or name not in EXPERIMENTS:
            raise SystemExit(f"expected NAME=PATH, NAME one of {list(EXPERIMENTS)}; got {item!r}")
        rec = json.loads((results / rel).read_text())
        if rec.get("status") != "ok":
            raise SystemExit(f"{results / rel} has status {rec.get('status')!r}: pin an ok record")
        pins[name] = rel
    return pins


def main(argv: list[str] | None = None) -> None:
    names = "".join(f"\n  {name:36} python run.py {args}" for name, args in EXPERIMENTS.items())
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
        epilog=f"NAME (the command that makes its records):{names}",
    )
    ap.add_argument("pins", nargs="*", help="NAME=PATH (relative to --results) to pin")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--latest", action="store_true", help="pin the newest ok record of each")
    args = ap.parse_args(argv)
    path = args.results / MANIFEST
    current = yaml.safe_load(path.read_text()) if path.is_file() else {}
    pins = (current or {}).get("experiments") or {}
    if args.latest or args.pins:
        pins = repin(args.results, pins, args.latest, args.pins)
        text = path.read_text() if path.is_file() else HEADER
        path.write_text(replace_block(text, "experiments", pins))
        print(f"pinned: {path}")
    make_all.main(["--results", str(args.results)])


if __name__ == "__main__":
    main()
