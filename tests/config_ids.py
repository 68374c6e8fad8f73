"""The run ids of every experiment file and of representative command lines, as the harness
computes them: the snapshot that a change to the config layout (``conf/kind/``, ``conf/scale/``)
must leave unchanged (``tests/test_config_ids.py``).

Each command line is composed like ``python run.py <args>`` (``tests/harness_util.py``
``compose``), prepared and resolved like ``run.py`` ``run_job`` does, then gives its record path
(``experiments.records.record_path``) and its identity (``run_identity`` with the kind's drop);
an in-process sweep gives each point's too, and an experiment file with ``hydra/sweeper=points``
gives every job of its multirun. ``git_rev=snapshot`` pins the code revision (it is not part of
the config's identity), so the ids do not move with each commit. A job that the harness refuses
before it writes (a missing data file, a missing package) keeps its ``config_id`` and the refusal.
A study at a small model's scale is ``experiment=<study> scale=<preset>`` (conf/scale/): the 9
experiment files that copied a study per model and length are gone, and their entries moved to
that spelling with their ids (:data:`RENAMED`).

    PYTHONPATH=. python tests/config_ids.py --write    # rewrite tests/data/config_ids.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "data" / "config_ids.json"
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

PINNED = ["git_rev=snapshot", "results_dir=results", "device=cpu"]
# Representative command lines (besides every conf/experiment/ file): README/docs examples.
COMMAND_LINES = [
    [],
    ["method=s2o", "tau=0.005"],
    ["method=s2o", "tau=0.001", "S=1024"],
    ["method=full"],
    ["method=flexprefill"],
    ["method=xattn", "data.L=4096"],
    ["data=model", "model=smollm2_135m"],
    ["kind=e2e", "model=smollm2_135m"],
    ["kind=e2e", "model=gemma3_270m", "method=s2o", "tau=0.02"],
    ["kind=e2e", "model=llama31_8b", "method=full"],
    ["kind=e2e", "model=smollm2_135m", "dry_run=true"],
    ["kind=e2e", "model=smollm2_135m", "e2e.lengths=[4096]", "e2e.reps=5"],
    ["method=s2o", "dry_run=true"],
    ["kind=accuracy", "benchmark=ruler", "model=smollm2_135m", "method=s2o"],
    ["kind=accuracy", "benchmark=ruler", "model=smollm2_135m", "method=full"],
    ["kind=accuracy", "benchmark=infinitebench", "model=smollm2_135m", "method=s2o"],
    ["kind=sweep", "name=tau_grid", "+sweep.grid.tau=[0.001,0.01]"],
    ["kind=sweep", "name=s_grid", "+sweep.grid.S=[1024,2048]", "method=s2o"],
    ["experiment=hparams_tau", "kind=operator", "tau=0.002", "data.text=essays"],
    ["experiment=component_ablation", "kind=operator", "data.text=essays"],
    ["experiment=hparams_S", "data.text=essays"],
    ["experiment=accuracy_small_rows", "kind=operator"],
    ["kind=operator", "benchmark=ruler"],
    ["kind=e2e", "model=smollm2_135m", "benchmark=ruler"],
    ["kind=matched", "name=m", "+matched.methods=[s2o]", "+matched.knobs={}",
     "+matched.ranges={s2o:[1.0e-5,0.5]}", "+matched.scan={}", "+matched.target_sparsity=[0.9]",
     "+matched.target_mse=[]", "+matched.tol_sparsity=0.002"],
]  # fmt: skip


# conf/scale/ replaced 9 experiment files (issue 30, step 6): each file's command line -> the one
# that makes the same runs now. Their snapshot entries were moved to the new spelling unchanged
# (not recomputed), so tests/test_config_ids.py checks that the new command line gives the ids,
# record folders and sweep points that the old one gave.
RENAMED = {
    "experiment=fig4a_gemma3_270m_8k": "experiment=fig4a_mse_vs_sparsity scale=gemma3_270m_8k",
    "experiment=fig4a_gemma3_270m_32k": "experiment=fig4a_mse_vs_sparsity scale=gemma3_270m_32k",
    "experiment=fig4a_smollm2_135m_8k": "experiment=fig4a_mse_vs_sparsity scale=smollm2_135m_8k",
    "experiment=hparams_S_gemma3_270m_8k": "experiment=hparams_S scale=gemma3_270m_8k",
    "experiment=hparams_S_gemma3_270m_32k": "experiment=hparams_S scale=gemma3_270m_32k",
    "experiment=hparams_tau_gemma3_270m_8k": "experiment=hparams_tau scale=gemma3_270m_8k",
    "experiment=hparams_tau_gemma3_270m_32k": "experiment=hparams_tau scale=gemma3_270m_32k",
    "experiment=component_ablation_gemma3_270m_8k":
        "experiment=component_ablation scale=gemma3_270m_8k",
    "experiment=component_ablation_gemma3_270m_32k":
        "experiment=component_ablation scale=gemma3_270m_32k",
}  # fmt: skip


def experiments() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def _ids(cfg, overrides: list[str]) -> dict:
    """``{path, id, config_id}`` of one job (``error`` in place of path and id when the harness
    refuses it before it writes), plus ``points`` for an in-process sweep."""
    import run
    from experiments import records
    from experiments.common import resolved_config

    ctx = run.job_context(cfg)
    prepared = run.prepare(cfg, overrides)
    resolved = resolved_config(prepared, ctx)
    out = {"config_id": records.config_id(resolved, records._drop_for(resolved))}
    try:
        run.check_job(resolved)  # the kind's own refusals, as run.check makes them
        path = records.record_path(resolved)
        ident = records.run_identity(resolved, records._drop_for(resolved))
    except Exception as exc:  # noqa: BLE001  (kept as the job's outcome: it must stay the same)
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    else:
        out["path"] = str(path.relative_to(resolved["results_dir"]))
        out["id"] = ident["id"]
    if resolved["kind"] == "sweep":
        out["points"] = _sweep_points(prepared, resolved, ctx)
    return out


def _sweep_points(prepared, resolved: dict, ctx) -> dict:
    from experiments import records, sweep
    from experiments.common import resolved_config

    points = {}
    for label, sets in sweep.expand(resolved["sweep"]):
        presolved = resolved_config(sweep.point_config(prepared, sets), ctx)
        point = {"config_id": records.config_id(presolved, records._drop_for(presolved))}
        try:
            path = records.point_record_path(presolved)
        except Exception as exc:  # noqa: BLE001
            point["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        else:
            point["path"] = str(path.relative_to(resolved["results_dir"]))
        points[label or "-"] = point
    return points


def job(args: list[str]) -> dict:
    from harness_util import compose

    overrides = args + PINNED
    try:
        cfg = compose(overrides)
        return _ids(cfg, overrides)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}


def multirun_jobs(args: list[str]) -> list[list[str]]:
    """The jobs of ``python run.py -m <args>`` (``experiment=<name>``, maybe ``scale=<preset>``)
    with ``hydra/sweeper=points`` (none for a file without points)."""
    from harness_util import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.s2o_sweepers.points import expand

    cfg = compose(args)
    points = cfg.hydra.sweeper.get("points") if "sweeper" in cfg.hydra else None
    if not points:
        return []
    parser = OverridesParser.create()
    command_line = parser.parse_overrides(args)
    return expand(list(points), command_line, parser)


def snapshot() -> dict:
    import run  # noqa: F401  (registers the flashprefill_alpha resolver)

    out = {}
    for args in COMMAND_LINES:
        out[" ".join(args) or "(default)"] = job(args)
    for line in [f"experiment={name}" for name in experiments()] + list(RENAMED.values()):
        out[line] = job(line.split())
        out[f"{line} dry_run=true"] = job([*line.split(), "dry_run=true"])
        for args in multirun_jobs(line.split()):
            out["-m " + " ".join(args)] = job(args)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {SNAPSHOT.relative_to(ROOT)}")
    a = ap.parse_args()
    snap = snapshot()
    if a.write:
        SNAPSHOT.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
        print(f"{SNAPSHOT}: {len(snap)} command lines")
        return
    old = json.loads(SNAPSHOT.read_text())
    diff = sorted(k for k in set(old) | set(snap) if old.get(k) != snap.get(k))
    for k in diff:
        print(f"{k}\n  was: {old.get(k)}\n  now: {snap.get(k)}")
    print(f"{len(snap)} command lines, {len(diff)} differ")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
