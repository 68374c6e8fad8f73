"""Reading run records (never recomputing): the helpers every analysis script uses."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def paper_numbers() -> dict:
    return yaml.safe_load((HERE / "paper_numbers.yaml").read_text())


def experiment_records(results: Path, name: str) -> list[dict]:
    """Ok records of ``results/experiments/<name>/*/record.json``, newest first."""
    recs = []
    for p in sorted((Path(results) / "experiments" / name).glob("*/record.json")):
        rec = json.loads(p.read_text())
        if rec.get("status") == "ok":
            rec["_path"] = str(p)
            recs.append(rec)
    return sorted(recs, key=lambda r: r["environment"]["time"], reverse=True)


def latest(results: Path, name: str) -> dict | None:
    recs = experiment_records(results, name)
    return recs[0] if recs else None


def describe(rec: dict) -> str:
    env, cfg = rec["environment"], rec["config"]
    data = cfg["data"]
    src = data["source"] + (f" {cfg['model']['path']}" if data["source"] == "model" else "")
    return (
        f"{rec['_path']}: {src}, L={data['L']}, device {env['device_name']}, dtype {cfg['dtype']}, "
        f"git {env['git_revision'][:10]}, {env['time']}"
    )
