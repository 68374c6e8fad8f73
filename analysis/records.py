"""Reading run records (never recomputing): the helpers every analysis script uses.

Published tables and figures come from the records pinned in ``results/manifest.yaml``
(:func:`pinned`); ``--latest`` in a script takes the newest ok record of each experiment instead
(:func:`latest`), for looking at one's own runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MANIFEST = "manifest.yaml"
# Where the scripts write by default: git-ignored, so analysis never modifies a tracked file.
SCRATCH = ROOT / "outputs" / "analysis"


def rel_path(path) -> str:
    """A record's path as the pages print it: from ``results/`` on (as given when it has none)."""
    parts = Path(path).parts
    return str(Path(*parts[parts.index("results") :])) if "results" in parts else str(path)


CONF = ROOT / "conf"
# the kinds whose records are results/experiments/<name>/<id>/record.json (the other kinds' have a
# folder of their own: experiments/records.py PATHS)
RECORD_KINDS = ("sweep", "matched")
# what a scaled study's name (conf/scale/study/<experiment>.yaml) reads: the scale preset chosen
SCALE_CHOICE = "${hydra:runtime.choices.scale}"


def experiment_commands(conf: Path = CONF) -> dict[str, str]:
    """Each name of ``results/experiments/<name>/`` that a command makes -> the command's
    arguments: every ``conf/experiment/`` file of a kind in :data:`RECORD_KINDS` (its ``name``),
    and every study that ``conf/scale/study/`` scales at every ``conf/scale/`` preset (the study
    file's ``name`` with the preset's name in it). Read from the files, not composed;
    ``tests/test_analysis.py`` checks them against Hydra's composition."""
    out = {}
    for path in sorted((conf / "experiment").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text()) or {}
        kinds = [d["override /kind"] for d in cfg.get("defaults") or []
                 if isinstance(d, dict) and "override /kind" in d]  # fmt: skip
        if kinds and kinds[-1] in RECORD_KINDS:
            out[cfg["name"]] = f"experiment={path.stem}"
    presets = sorted(p.stem for p in (conf / "scale").glob("*.yaml"))
    for path in sorted((conf / "scale" / "study").glob("*.yaml")):
        name = (yaml.safe_load(path.read_text()) or {})["name"]
        for preset in presets:
            out[name.replace(SCALE_CHOICE, preset)] = f"experiment={path.stem} scale={preset}"
    return out


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


def manifest(results: Path) -> dict:
    path = Path(results) / MANIFEST
    if not path.is_file():
        raise SystemExit(
            f"no {path}: pin records with `python analysis/pin.py --latest`, or pass --latest"
        )
    return yaml.safe_load(path.read_text()) or {}


def pinned(results: Path, name: str) -> dict | None:
    """The record of experiment ``name`` pinned in ``results/manifest.yaml`` (None if unpinned)."""
    rel = (manifest(results).get("experiments") or {}).get(name)
    if rel is None:
        return None
    path = Path(results) / rel
    rec = json.loads(path.read_text())
    if rec.get("status") != "ok":
        raise SystemExit(f"{path} (pinned for {name}) has status {rec.get('status')!r}")
    rec["_path"] = str(path)
    return rec


def record_for(results: Path, name: str, use_latest: bool) -> dict | None:
    return latest(results, name) if use_latest else pinned(results, name)


def stale_points(rec: dict) -> list[str]:
    """Labels of sweep points whose record was made by other code or data (``reuse_stale``)."""
    return [p["label"] for p in rec["metrics"].get("points", []) if p.get("stale")]


def sharing(env: dict) -> list[str]:
    """Whether the record shared its GPU while it ran, in words (empty: no sign of it, see
    :func:`alone_on_gpu`): another process on it (``gpu_processes`` > 1), a launcher running
    several jobs on it (``jobs_per_gpu`` > 1) or other processes of this harness (``gpu_jobs`` >
    1), in which case its times are not clean."""
    shared = []
    if (env.get("gpu_processes") or 0) > 1:
        shared.append(f"{env['gpu_processes']} processes on the GPU")
    if (env.get("jobs_per_gpu") or 0) > 1:
        shared.append(f"{env['jobs_per_gpu']} jobs per GPU")
    elif (env.get("gpu_jobs") or 0) > 1:
        shared.append(f"{env['gpu_jobs']} harness processes on the GPU")
    return shared


def alone_on_gpu(env: dict) -> bool:
    """Whether a GPU record says it had its GPU to itself: nothing in :func:`sharing`, and either
    ``nvidia-smi`` listed this process alone, or (a container's ``nvidia-smi`` lists none) no
    other process of this harness used the GPU while the job ran (``gpu_jobs`` 1)."""
    if sharing(env):
        return False
    return env.get("gpu_processes") == 1 or (
        env.get("gpu_processes") is None and env.get("gpu_jobs") == 1
    )


def on_cpu(env: dict) -> bool:
    """Whether the record ran on the CPU (``device`` ``cpu``)."""
    return str(env.get("device", "")).startswith("cpu")


def device_name(env: dict) -> str:
    """The record's device model; a CPU record says so (its ``device_name`` is the processor,
    e.g. ``x86_64``)."""
    name = env["device_name"]
    return f"CPU ({name})" if on_cpu(env) else name


def device_label(env: dict) -> str:
    """The record's device (:func:`device_name`), and whether it shared the GPU while it ran
    (:func:`sharing`)."""
    shared, name = sharing(env), device_name(env)
    return f"{name} (SHARED: {', '.join(shared)}; times not clean)" if shared else name


def git_short(env: dict, n: int = 7) -> str:
    """The record's code revision, its first ``n`` characters. Records made with an unquoted
    all-digit ``git_rev=`` hold it as a number (run.py refuses that now): read it as text."""
    return str(env["git_revision"])[:n]


def describe(rec: dict) -> str:
    env, cfg = rec["environment"], rec["config"]
    data = cfg["data"]
    if data["source"] == "model":  # the model's name, and where its weights came from if given
        model = cfg["model"]
        where = model.get("path") or model.get("package") or model.get("gguf_file")
        src = f"model {model['name']}" + (f" ({where})" if where else "") + f", text {data['text']}"
    else:
        src = data["source"]
    text = (
        f"{rec['_path']}: {src}, L={data['L']}, device {device_label(env)}, dtype {cfg['dtype']}, "
        f"git {git_short(env, 10)}, {env['time']}"
    )
    if rec.get("stale"):
        text += f"; STALE: reused from code {rec['stale'].get('code')} (reuse_stale=true)"
    stale = stale_points(rec)
    if stale:
        text += f"; STALE points (other code or data, reuse_stale=true): {', '.join(stale)}"
    return text
