"""The launcher studies' pages: ``summary.md`` from the ``summary.json`` that
``tools/node_gpus_sweep.py`` writes (a GPU sweep on every GPU against one, or ``--overhead``:
the launcher's cost per job). Reads the summary only.

    python -m analysis.launchers results/launchers/<folder>/summary.json   # summary.md beside it
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pandas as pd

from analysis.tables import markdown as md_table


def markdown(s: dict) -> str:
    """The page of one summary, by its kind (a list of sweeps: ``--overhead``)."""
    return overhead_markdown(s) if isinstance(s["sweeps"], list) else sweep_markdown(s)


def _samples(sweep: dict, cut: bool) -> str:
    """An accuracy sweep's throughput (``--accuracy``): its samples over its wall time; none for
    a sweep that was cut (summaries before the fix counted a cut sweep's planned samples)."""
    if "samples_per_min" not in sweep:
        return ""
    if cut or sweep["samples_per_min"] is None:
        return "; cut before its end: no samples-per-minute figure"
    return f"; {sweep['samples']} samples, {sweep['samples_per_min']:.1f} a minute"


def sweep_markdown(s: dict) -> str:
    """A GPU sweep's summary (``tools/node_gpus_sweep.py``): wall times, the speedup or why
    there is none, each point's GPU, CPUs, worker and time, and nvidia-smi's utilization."""
    two, one = s["sweeps"]["2gpu"], s["sweeps"]["1gpu"]
    speedup = s["speedup_2gpu_over_1gpu"]
    incomplete = s.get("incomplete", [])
    cut = {tag: any(c.startswith(f"{tag}:") for c in incomplete) for tag in s["sweeps"]}
    lines = [
        f"# node_gpus sweep, rev {s['git_rev']}, {s['time']}",
        "",
        f"GPUs: {s['gpus']}",
        "",
        f"Command: `{s.get('command', '?')}`",
        "",
        f"- all visible GPUs: {two['wall_s']:.1f} s wall (exit {two['returncode']})"
        + _samples(two, cut["2gpu"]),
        f"- GPU 0 alone: {one['wall_s']:.1f} s wall (exit {one['returncode']})"
        + _samples(one, cut["1gpu"]),
        f"- speedup: {speedup:.2f}x"
        if speedup is not None
        else f"- speedup: not measured (a sweep is incomplete: {'; '.join(s['incomplete'])})",
        "",
    ]
    df = pd.DataFrame(
        [
            {
                "sweep": tag,
                "point": p["point"],
                "GPU": p["gpu"],
                "seen by job": p["gpu_seen_by_job"],
                "CPUs": p.get("cpus"),
                "worker pid (job)": f"{p['pid']} ({p['worker_job']})",
                "elapsed s": p["elapsed_s"],
                "job s": p["job_s"],
                "status": p["status"],
            }
            for tag in ("2gpu", "1gpu")
            for p in s["sweeps"][tag]["points"]
        ]
    ).astype(object)
    lines.append(md_table(df, {"elapsed s": ".1f"}))
    lines += ["", "nvidia-smi during each sweep (1 s samples): mean utilization %, fraction >= 50%"]
    for tag in ("2gpu", "1gpu"):
        use = s["sweeps"][tag]["gpu_use"]
        lines.append(f"- {tag}: {json.dumps(use) if use else 'no nvidia-smi samples'}")
    return "\n".join(lines) + "\n"


def overhead_markdown(s: dict) -> str:
    """An ``--overhead`` summary: per sweep the wall per job and the medians of its ledger."""
    lines = [
        f"# node_gpus cost per job, rev {s['git_rev']}, {s['time']}",
        "",
        f"Machine: {s['machine']}; GPUs: {s['gpus']}",
        "",
        f"CUDA_VISIBLE_DEVICES={s['cuda_visible_devices']} (one worker per listed value)",
        "",
        f"Command: `{s['command']}`",
        "",
        f"{s['points']} trivial points per sweep (run.py dry_run=true, timing off). elapsed: "
        "hand-off to result in the launcher; job: Hydra and the task in the worker; overhead: the "
        "difference (process start, imports, unpickling, result, process exit). Medians.",
        "",
    ]
    cols = {
        "tag": "sweep", "returncode": "exit", "ok": "ok", "wall_s": "wall s",
        "wall_per_job_s": "wall per job s", "median_elapsed_s": "elapsed s",
        "median_job_s": "job s", "median_overhead_s": "overhead s",
        "first_job_of_worker_elapsed_s": "1st job of a worker s",
        "later_jobs_elapsed_s": "later jobs s", "worker_processes": "processes",
        "loadavg_before": "load avg before",
    }  # fmt: skip
    df = pd.DataFrame([{v: r[k] for k, v in cols.items()} for r in s["sweeps"]]).astype(object)
    loadavg = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines.append(
        md_table(df, {"wall s": ".1f", "wall per job s": ".3f", "load avg before": loadavg})
    )
    on = [r["wall_per_job_s"] for r in s["sweeps"] if r["reuse_workers"]]
    off = [r["wall_per_job_s"] for r in s["sweeps"] if not r["reuse_workers"]]
    if on and off:
        ratio = statistics.mean(off) / statistics.mean(on)
        lines += ["", f"Wall per job, reuse off / on (mean over sweeps): {ratio:.2f}x"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summaries", nargs="+", type=Path, help="summary.json files")
    for path in ap.parse_args(argv).summaries:
        out = path.with_suffix(".md")
        out.write_text(markdown(json.loads(path.read_text())))
        print(out)


if __name__ == "__main__":
    main()
