"""Hydra entry point: compose the config, dispatch to ``experiments/<kind>.py``, write the record.

    python run.py method=s2o tau=0.005                          # the operator study (CPU or GPU)
    python run.py -m method=s2o tau=0.001,0.005 S=1024,2048     # a sweep, resumable
    python run.py experiment=hparams_tau                         # a paper table, by name

The record of a run lands in ``results/runs/<method>/<id>/record.json`` (kind=operator) or
``results/experiments/<name>/<id>/record.json`` (sweep, matched), ``<id>`` being a hash of the
resolved config; a rerun skips a record that exists with status ok. See docs/harness.md.
"""

from __future__ import annotations

import importlib
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.common import (
    NOT_IDENTITY,
    JobContext,
    WandbLogger,
    execute,
    experiment_record_path,
    identity,
    point_record_path,
    resolved_config,
)

KINDS = ("operator", "sweep", "matched", "e2e")


def job_context(cfg: DictConfig) -> JobContext:
    """Method choice, run mode and job number from Hydra (``cfg.hydra`` when composed by hand)."""
    hc = cfg.hydra if "hydra" in cfg else HydraConfig.get()
    mode = str(hc.get("mode", "RUN"))
    return JobContext(
        method=hc.runtime.choices["method"],
        multirun=mode.endswith("MULTIRUN"),
        job_num=int(hc.job.get("num", 0) or 0),
        overrides=list(hc.overrides.task),
    )


def prepare(cfg: DictConfig) -> DictConfig:
    """Drop the hydra node and, for ``dry_run=true``, merge the ``tiny`` block (strict keys)."""
    cfg = cfg.copy()
    if "hydra" in cfg:
        with_flag = OmegaConf.is_struct(cfg)
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        OmegaConf.set_struct(cfg, with_flag)
    if cfg.dry_run:
        _merge_existing(cfg, OmegaConf.to_container(cfg.tiny))
    return cfg


def _merge_existing(node: DictConfig, values: dict) -> None:
    """Apply ``values`` where the key exists in ``node`` (one ``tiny`` block serves every data
    source); dicts recurse, anything else (lists included) replaces."""
    for key, value in values.items():
        if key not in node:
            continue
        if isinstance(value, dict) and isinstance(node[key], DictConfig):
            _merge_existing(node[key], value)
        else:
            node[key] = value


def run_job(cfg: DictConfig, ctx: JobContext | None = None) -> dict:
    """Run one Hydra job and return its record (also written to disk)."""
    ctx = ctx or job_context(cfg)
    if cfg.kind not in KINDS:
        raise ValueError(f"kind={cfg.kind!r} is not one of {list(KINDS)}")
    cfg = prepare(cfg)
    resolved = resolved_config(cfg, ctx)
    is_point = resolved["kind"] == "operator"
    if is_point:
        path = point_record_path(resolved)
    elif resolved["kind"] == "e2e":
        path = e2e_record_path(resolved)
    else:
        path = experiment_record_path(resolved)
    if resolved["skip_done"] and _done(path):
        print(f"skip: {path} exists with status ok")
        return {"status": "ok", "skipped": True, "path": str(path)}
    kind = importlib.import_module(f"experiments.{resolved['kind']}")
    logger = WandbLogger(resolved["wandb"], resolved, name=f"{resolved['name']}-{path.parent.name}")
    record, _ = execute(resolved, path, lambda: kind.run(cfg, resolved, ctx, logger))
    logger.finish(exit_code=0 if record["status"] == "ok" else 1)
    if record["status"] != "ok":
        print(f"error: {record['error']}\n{record['traceback']}", file=sys.stderr)
    print(f"record: {path} ({record['status']}, {record['elapsed_s']:.1f} s)")
    return {**record, "path": str(path)}


def e2e_record_path(resolved: dict):
    """``results/e2e/<model>/<method>/<id>/record.json``."""
    from pathlib import Path

    model = (resolved.get("model") or {}).get("name", "no_model")
    rid = identity(resolved, NOT_IDENTITY)
    return (
        Path(resolved["results_dir"])
        / "e2e"
        / model
        / resolved["method_name"]
        / rid
        / "record.json"
    )


def _done(path) -> bool:
    from experiments.common import read_record

    rec = read_record(path)
    return rec is not None and rec.get("status") == "ok"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    ctx = job_context(cfg)
    record = run_job(cfg, ctx)
    if record["status"] != "ok" and not ctx.multirun:
        sys.exit(1)


if __name__ == "__main__":
    main()
