"""A sweep inside one job: every point is an operator run with its own record (resumable).

``sweep.grid`` maps dotted config keys to value lists (cartesian product, e.g. ``tau``, ``S``,
``data.L``); ``sweep.points`` is a list of ``{label, set: {dotted.key: value}}`` for named variants
(the component ablation). Both may be given: every point of ``points`` is combined with every grid
point. A point's record is the one ``python run.py <same overrides>`` writes, so single runs, ``-m``
sweeps and experiment files share results. Inputs (and the Full reference) are built once per
distinct data config.
"""

from __future__ import annotations

import itertools

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from . import operator
from .common import JobContext, WandbLogger, resolved_config
from .records import execute, point_record_path


def expand(sweep: dict) -> list[tuple[str, dict]]:
    """``[(label, {dotted.key: value})]`` of every point, grid x named points."""
    grid = sweep.get("grid") or {}
    keys = list(grid)
    combos = [dict(zip(keys, vals)) for vals in itertools.product(*grid.values())] or [{}]
    named = sweep.get("points") or [{"label": "", "set": {}}]
    out = []
    for p in named:
        for combo in combos:
            label = ",".join(
                [p["label"]] * bool(p["label"]) + [f"{k}={v}" for k, v in combo.items()]
            )
            out.append((label, {**p["set"], **combo}))
    return out


def point_config(cfg: DictConfig, sets: dict) -> DictConfig:
    """``cfg`` with ``sets`` applied (keys must exist: struct mode), as a single operator run."""
    point = cfg.copy()
    for key, value in sets.items():
        if OmegaConf.select(point, key, default="__absent__") == "__absent__":
            raise KeyError(f"sweep key {key!r} is not in the config")
        OmegaConf.update(point, key, value, merge=False)
    OmegaConf.update(point, "kind", "operator")
    return point


def run(cfg: DictConfig, resolved: dict, ctx: JobContext, logger: WandbLogger) -> dict:
    points = expand(resolved["sweep"])
    rows = []
    bar = tqdm(points, desc=resolved["name"], disable=not resolved["progress"])
    for step, (label, sets) in enumerate(bar):
        bar.set_postfix_str(label)
        presolved = resolved_config(point_config(cfg, sets), ctx)
        path = point_record_path(presolved)
        record, skipped = execute(
            presolved, path, lambda p=presolved: operator.evaluate(p, operator.PROCESS_DATA)
        )
        row = {"label": label, "set": sets, "record": str(path), "status": record["status"]}
        row["skipped"] = skipped
        if record.get("stale"):
            row["stale"] = record["stale"]
        if record["status"] == "ok":
            row["metrics"] = {k: v for k, v in record["metrics"].items() if k != "per_layer"}
            logger.log({**operator.scalars(record["metrics"]), **_numeric(sets)}, step=step)
        else:
            row["error"] = record["error"]
        rows.append(row)
    print(summary_table(rows))
    failed = [r["label"] for r in rows if r["status"] != "ok"]
    if failed:
        print(f"failed points ({len(failed)} of {len(rows)}): {'; '.join(failed)}")
    return {"points": rows, "n_points": len(rows), "n_failed": len(failed), "failed": failed}


def _numeric(sets: dict) -> dict:
    return {k: v for k, v in sets.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def summary_table(rows: list[dict]) -> str:
    lines = [f"{'point':<36} {'status':<7} {'sparsity':<9} {'MSE':<10} {'MAE':<10} {'total_ms':<9}"]
    for r in rows:
        m = r.get("metrics") or {}
        lat = m.get("latency") or {}
        cells = [m.get("sparsity"), m.get("mse"), m.get("mae"), lat.get("total_ms")]
        fmts = (".4f", ".3e", ".3e", ".2f")
        text = ["-" if c is None else format(c, f) for c, f in zip(cells, fmts)]
        status = r["status"] + ("~" if r.get("stale") else "*" if r.get("skipped") else "")
        lines.append(f"{r['label'][:36]:<36} {status:<7} " + " ".join(f"{t:<9}" for t in text))
    lines.append("(* = record existed, skipped; ~ = stale record of other code or data reused)")
    return "\n".join(lines)
