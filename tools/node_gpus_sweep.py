"""Every GPU of a node against one: the same operator sweep through ``hydra/launcher=node_gpus``
on all visible GPUs, then on the first GPU alone, with ``nvidia-smi`` sampling during both.

    python3 -m tools.node_gpus_sweep --out "$OUT"               # the 2-GPU machine
    python3 -m tools.node_gpus_sweep --out /tmp/ng --tiny       # CPU dry run, fake GPUs 0,1
    python3 -m tools.node_gpus_sweep --overhead 16 --out results/launchers/<name>   # CPU
    python3 -m tools.node_gpus_sweep --accuracy --jobs-per-gpu 4 --out "$OUT" --extra ...

The sweep: S2O on the synthetic input at ``--L`` tokens (32 query / 8 KV heads, bf16), one point
per ``--taus`` value; each point times estimation, attention and Full with ``do_bench`` for
``--rep-ms`` ms apiece, so a point keeps its GPU busy for tens of seconds. One untimed point runs
first (``warmup/``) so that Triton compiles outside both timed sweeps and the synthetic input is
built once into ``--input-cache``: without it each worker's first point builds the 64K input on its
CPUs (about 19 s on an H100 machine's 16 cores at a7eb891, 35-54 s on 2 cores), which neither sweep
can overlap. The speedup is reported only when both sweeps ran every point.

Writes under ``--out``: ``sweep_<n>gpu/`` (Hydra's sweep folder: ``node_gpus.jsonl`` says which GPU
ran each point and when, ``.node_gpus/*.log`` each job's output), ``results_<n>gpu/`` (the run
records), ``nvidia_smi_<n>gpu.csv`` (index, utilization, memory every second) and
``compute_apps_<n>gpu.csv`` (which process held memory on which GPU), ``run_<n>gpu.log`` (the
launcher's output) and ``summary.json`` (wall times, speedup, the GPU of each point, each GPU's
mean utilization and busy fraction while the sweep ran; ``python -m analysis.launchers
<out>/summary.json`` writes its tables to ``summary.md``). ``--reuse-workers false`` runs both
sweeps with a new process per job (the launcher's ``reuse_workers``).

``--accuracy`` times an accuracy sweep instead (issue 31's second run): one kind=accuracy job per
method (full, s2o, flexprefill, xattn, pbs) on RULER ``--task`` at ``--L`` tokens (8192), ``--n``
samples each, of ``--model`` (Gemma 3 270M; ``--extra model.path=<dir> model.gguf_file=<file>``
where its package is not installed), ``--jobs-per-gpu`` jobs at once on a GPU. A warm-up of one
sample per method comes first (model caches, kernels); each timed sweep builds its own prompts.
``summary.json`` adds each sweep's samples and samples per minute. ``--tiny``: SmolLM2 on the
CPU at 1K tokens, two methods.

``--overhead N`` measures the launcher's cost per job instead, on any machine (a CPU is enough):
N trivial points (``dry_run=true`` at its tiny size, ``timing.enabled=false``, one per seed)
through ``node_gpus`` on fake GPUs (``--fake-gpus``, default one), with ``reuse_workers=true``
and ``=false``, alternating, ``--repeats`` times each. It writes ``summary.json`` (its page:
``analysis.launchers``), each sweep's ledger (``node_gpus_<tag>.jsonl``) and launcher log
(``run_<tag>.log``) under ``--out``; the jobs' pickles and records go to a temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from experiments.provenance import environment, git_revision
from experiments.records import write_record

ROOT = Path(__file__).resolve().parents[1]


# --accuracy: issue 31's accuracy sweep, five methods on one RULER task of a small model
ACCURACY_METHODS = "full,s2o,flexprefill,xattn,pbs"
TINY_METHODS = "full,s2o"  # --accuracy --tiny: the CPU check's two


def accuracy_args(args: argparse.Namespace, n: int) -> list[str]:
    """run.py overrides of the accuracy sweep: one job per method, ``n`` samples each."""
    if args.tiny:  # CPU: the real SmolLM2 (its PyPI GGUF) at 1K tokens, two methods, fp32
        return [f"method={TINY_METHODS}", "kind=accuracy", "benchmark=ruler", "model=smollm2_135m",
                "device=cpu", "dtype=float32", "benchmark.tasks=[niah_single_1]",
                "benchmark.lengths=[1024]", f"benchmark.n={n}"]  # fmt: skip
    return [
        f"method={ACCURACY_METHODS}",
        "kind=accuracy",
        "benchmark=ruler",
        f"model={args.model}",
        f"benchmark.tasks=[{args.task}]",
        f"benchmark.lengths=[{args.L}]",
        f"benchmark.n={n}",
        f"hydra.launcher.jobs_per_gpu={args.jobs_per_gpu}",
        *args.extra,
    ]


def sweep_args(args: argparse.Namespace) -> list[str]:
    """run.py overrides of the sweep (without the launcher)."""
    if getattr(args, "accuracy", False):
        return accuracy_args(args, args.n)
    if args.tiny:
        return ["method=s2o", f"tau={','.join(args.taus)}", "dry_run=true", "timing.rep=2"]
    return [
        "method=s2o",
        f"tau={','.join(args.taus)}",
        "data=synthetic",
        f"data.L={args.L}",
        "data.heads_q=32",
        "data.heads_kv=8",
        f"S={args.S}",
        f"timing.cuda_rep_ms={args.rep_ms}",
        "timing.cuda_warmup_ms=200",
        *([f"input_cache={args.input_cache}"] if args.input_cache else []),
    ]


def run_sweep(
    args: argparse.Namespace,
    tag: str,
    gpus: str | None,
    overrides: list[str],
    work: Path | None = None,
) -> dict:
    """One ``run.py -m`` through node_gpus, with nvidia-smi sampling around it; its wall time.
    The sweep folder and the records go under ``work`` (default ``--out``)."""
    out, work = args.out, work or args.out
    common = [f"git_rev={args.git_rev}", "skip_done=false", "progress=false", "wandb.mode=disabled"]
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "hydra/launcher=node_gpus",
        f"hydra.launcher.reuse_workers={args.reuse_workers}",
        f"hydra.sweep.dir={work / f'sweep_{tag}'}",
        f"results_dir={work / f'results_{tag}'}",
        *([f"hydra.launcher.gpus=[{gpus}]"] if gpus is not None else []),
        *overrides,
        *common,
    ]
    samplers = start_samplers(out, tag)
    t0 = time.time()
    with open(out / f"run_{tag}.log", "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        # its own process group: on timeout the sweep's job processes are stopped with it
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(10.0, args.deadline - t0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            code = "timeout (--budget-s)"
    t1 = time.time()
    for p in samplers:
        p.terminate()
        p.wait()
    print(f"{tag}: exit {code}, {t1 - t0:.1f} s wall", flush=True)
    return {
        "tag": tag,
        "command": cmd,
        "returncode": code,
        "start": t0,
        "end": t1,
        "wall_s": t1 - t0,
    }


def start_samplers(out: Path, tag: str) -> list[subprocess.Popen]:
    """nvidia-smi every second in the background (nothing when there is no nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    queries = {
        f"nvidia_smi_{tag}.csv": "--query-gpu=timestamp,index,utilization.gpu,memory.used",
        f"compute_apps_{tag}.csv": "--query-compute-apps=timestamp,gpu_uuid,pid,used_memory",
    }
    return [
        subprocess.Popen(
            ["nvidia-smi", q, "--format=csv,nounits", "-l", "1"],
            stdout=open(out / name, "w"),
            stderr=subprocess.DEVNULL,
        )
        for name, q in queries.items()
    ]


def gpu_use(out: Path, tag: str, start: float, end: float) -> dict:
    """Per GPU index: samples, mean utilization and the fraction of samples at >= 50% during the
    sweep (samples outside [start, end] are dropped)."""
    path = out / f"nvidia_smi_{tag}.csv"
    if not path.exists():
        return {}
    per: dict[str, list[float]] = {}
    with open(path) as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            util_key = next((k for k in row if k and k.startswith("utilization.gpu")), None)
            try:  # the header says "utilization.gpu [%]"; repeated headers and blanks are skipped
                stamp = datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f")
                util = float(row[util_key])
            except (KeyError, TypeError, ValueError):
                continue
            if start <= stamp.astimezone().timestamp() <= end:
                per.setdefault(row["index"], []).append(util)
    return {
        i: {
            "samples": len(u),
            "mean_util": round(sum(u) / len(u), 1),
            "busy_fraction": round(sum(x >= 50 for x in u) / len(u), 3),
        }
        for i, u in sorted(per.items())
        if u
    }


def points(out: Path, tag: str) -> list[dict]:
    """The ledger of a sweep: which GPU and worker ran each point, when, how it ended."""
    ledger = out / f"sweep_{tag}" / "node_gpus.jsonl"
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    rows = sorted((json.loads(line) for line in lines), key=lambda r: r["num"])
    keep = ("num", "gpu", "gpu_seen_by_job", "pid", "worker_job", "start", "end", "elapsed_s")
    keep += ("job_s", "status", "why", "cpus")
    return [{k: r.get(k) for k in keep} | {"point": _tau(r["overrides"])} for r in rows]


def _tau(overrides: list[str]) -> str:
    return next((o for o in overrides if o.startswith("tau=")), " ".join(overrides))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/_scratch")))
    ap.add_argument("--L", type=int, default=None, help="tokens (65536; --accuracy: 8192)")
    ap.add_argument("--S", type=int, default=2048)
    ap.add_argument("--rep-ms", type=int, default=3000, help="do_bench time per timed function")
    ap.add_argument("--taus", default="0.001,0.002,0.003,0.004,0.005,0.01,0.02,0.05")
    ap.add_argument("--tiny", action="store_true", help="CPU dry run: tiny points, fake GPUs 0,1")
    ap.add_argument(
        "--git-rev",
        default=None,
        help="the code's revision (default: $S2O_GIT_REV, else git rev-parse HEAD)",
    )
    ap.add_argument("--budget-s", type=float, default=540, help="stop the sweeps after this long")
    ap.add_argument("--reuse-workers", choices=["true", "false"], default="true")
    ap.add_argument(
        "--input-cache",
        default="auto",
        help="the sweep's input_cache folder: the warm-up point builds the synthetic input once "
        "and every worker's first point loads it (auto: <out>/input_cache; none: each worker "
        "builds it on its CPUs, 15-35 s at 64K, on the critical path of both sweeps)",
    )
    ap.add_argument("--accuracy", action="store_true",
                    help="issue 31's accuracy sweep instead: five methods, one RULER task of "
                    "--model at --L tokens, --n samples each")  # fmt: skip
    ap.add_argument("--model", default="gemma3_270m")
    ap.add_argument("--task", default="niah_single_1")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--jobs-per-gpu", type=int, default=1)
    ap.add_argument("--extra", nargs="*", default=[],
                    help="--accuracy: more run.py overrides (model.path=...)")  # fmt: skip
    ap.add_argument("--overhead", type=int, default=0, metavar="N", help="launcher cost per job")
    ap.add_argument("--fake-gpus", default="0", help="--overhead: CUDA_VISIBLE_DEVICES to use")
    ap.add_argument("--repeats", type=int, default=2, help="--overhead: sweeps per setting")
    args = ap.parse_args()
    args.taus = args.taus.split(",")
    args.L = args.L or (8192 if args.accuracy else 65536)
    # one reader with the records: a copied tree's .git may name an older commit than the code
    args.git_rev = git_revision(args.git_rev)
    args.out = args.out.resolve()
    args.deadline = time.time() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    args.input_cache = {"auto": str(args.out / "input_cache"), "none": None}.get(
        args.input_cache, args.input_cache
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.overhead:
        return overhead(args)
    if args.tiny:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    overrides = sweep_args(args)
    if args.accuracy:
        # one sample per method first: the model's caches (dequantized weights, verified
        # tokenizer) and every method's kernels are warm for both timed sweeps; each timed sweep
        # builds its own prompts (a sample cache of its own), so neither inherits the other's
        warm = accuracy_args(args, 1)
        tagged = {t: [*overrides, f"benchmark.cache_dir={args.out / f'samples_{t}'}"]
                  for t in ("2gpu", "1gpu")}  # fmt: skip
    else:
        warm = [o for o in overrides if not o.startswith("tau=")] + [
            "tau=0.005",
            "timing.enabled=false",
        ]
        tagged = {"2gpu": overrides, "1gpu": overrides}
    runs = [run_sweep(args, "warmup", "0", warm)]
    runs.append(run_sweep(args, "2gpu", None, tagged["2gpu"]))
    runs.append(run_sweep(args, "1gpu", "0", tagged["1gpu"]))
    summary = {
        "git_rev": args.git_rev,
        "command": " ".join(sys.argv),
        "args": {k: str(v) for k, v in vars(args).items()},
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpus": _gpu_names(),
        "sweeps": {},
    }
    for r in runs[1:]:
        r["points"] = points(args.out, r["tag"])
        r["gpu_use"] = gpu_use(args.out, r["tag"], r["start"], r["end"])
        summary["sweeps"][r["tag"]] = r
    two, one = summary["sweeps"]["2gpu"], summary["sweeps"]["1gpu"]
    methods = TINY_METHODS if args.tiny else ACCURACY_METHODS
    n_points = len(methods.split(",")) if args.accuracy else len(args.taus)
    cut = incomplete(summary, n_points)
    summary["incomplete"] = cut
    if args.accuracy:  # the samples its jobs wrote over its wall time; no rate for a cut one
        for tag, sweep in summary["sweeps"].items():
            sweep["samples"] = samples_written(args.out / f"results_{tag}")
            cut_here = any(c.startswith(f"{tag}:") for c in cut)
            sweep["samples_per_min"] = (
                None if cut_here else round(60 * sweep["samples"] / sweep["wall_s"], 1)
            )
    # a sweep cut short (budget, a failed point) has no comparable wall time: no speedup
    summary["speedup_2gpu_over_1gpu"] = None if cut else round(one["wall_s"] / two["wall_s"], 3)
    # the launcher's host process (torch, Triton, driver versions, revision); the GPUs: "gpus"
    summary["environment"] = environment("cpu", args.git_rev)
    write_record(args.out / "summary.json", summary)
    print(brief(summary, args.out))


def samples_written(results: Path) -> int:
    """The sample lines under a sweep's results folder (every job's ``samples.jsonl``)."""
    return sum(len(f.read_text().splitlines()) for f in results.rglob("samples.jsonl"))


def incomplete(s: dict, n_points: int) -> list[str]:
    """Why the sweeps' wall times do not compare: each sweep that did not exit 0 with every
    point ``ok``, in words (empty when both are complete)."""
    out = []
    for tag in ("2gpu", "1gpu"):
        sweep = s["sweeps"][tag]
        ok = sum(p["status"] == "ok" for p in sweep["points"])
        if sweep["returncode"] != 0 or ok < n_points:
            out.append(f"{tag}: {ok} of {n_points} points ok, exit {sweep['returncode']}")
    return out


def brief(s: dict, out: Path) -> str:
    """What the sweep prints: wall times and the speedup (or why there is none), or the wall per
    job of the overhead sweeps; the tables are analysis's (``python -m analysis.launchers``)."""
    if isinstance(s["sweeps"], list):  # --overhead
        lines = [f"{r['tag']}: exit {r['returncode']}, {r['wall_per_job_s']:.3f} s wall per job"
                 for r in s["sweeps"]]  # fmt: skip
    else:
        two, one = s["sweeps"]["2gpu"], s["sweeps"]["1gpu"]
        sp = s["speedup_2gpu_over_1gpu"]
        lines = [f"all visible GPUs: {two['wall_s']:.1f} s, GPU 0 alone: {one['wall_s']:.1f} s",
                 f"speedup: {sp:.2f}x" if sp is not None else
                 f"speedup: not measured ({'; '.join(s['incomplete'])})"]  # fmt: skip
    tables = f"python -m analysis.launchers {out / 'summary.json'}"
    return "\n".join([*lines, f"summary: {out / 'summary.json'} (tables: {tables})"])


def overhead(args: argparse.Namespace) -> None:
    """``--overhead N``: the launcher's cost per job, ``reuse_workers`` true against false."""
    os.environ["CUDA_VISIBLE_DEVICES"] = args.fake_gpus
    seeds = ",".join(str(i) for i in range(args.overhead))
    overrides = ["method=s2o", f"seed={seeds}", "dry_run=true", "timing.enabled=false"]
    summary = {
        "what": "node_gpus launcher cost per job: N trivial harness points, reuse_workers on/off",
        "git_rev": args.git_rev,
        "command": " ".join([sys.executable, *sys.argv]),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "gpus": _gpu_names(),
        "cuda_visible_devices": args.fake_gpus,
        "points": args.overhead,
        "sweeps": [],
    }
    with tempfile.TemporaryDirectory(prefix="node_gpus_overhead_") as tmp:
        for i in range(args.repeats):
            for reuse in ("true", "false"):
                args.reuse_workers, tag = reuse, f"reuse_{reuse}_{i}"
                load = os.getloadavg()
                run = run_sweep(args, tag, None, overrides, Path(tmp))
                ledger = Path(tmp) / f"sweep_{tag}" / "node_gpus.jsonl"
                if ledger.exists():
                    shutil.copy(ledger, args.out / f"node_gpus_{tag}.jsonl")
                rows = points(Path(tmp), tag)
                stats = per_job(rows, run["wall_s"], args.overhead)
                summary["sweeps"].append(
                    {"tag": tag, "reuse_workers": reuse == "true", "loadavg_before": load}
                    | {k: run[k] for k in ("command", "returncode", "wall_s")}
                    | stats
                )
    summary["environment"] = environment("cpu", args.git_rev)
    write_record(args.out / "summary.json", summary)
    print(brief(summary, args.out))


def per_job(rows: list[dict], wall_s: float, n: int) -> dict:
    """Per-job figures of one sweep's ledger rows: wall per job, and the medians of a job's time
    from hand-off to result (``elapsed_s``), of its time in the worker (``job_s``: Hydra and the
    task) and of the difference (the launcher's and the process's cost)."""
    ok = [r for r in rows if r["status"] == "ok" and r["job_s"] is not None]
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    return {
        "ok": len(ok),
        "wall_per_job_s": round(wall_s / n, 3),
        "median_elapsed_s": med([r["elapsed_s"] for r in ok]),
        "median_job_s": med([r["job_s"] for r in ok]),
        "median_overhead_s": med([r["elapsed_s"] - r["job_s"] for r in ok]),
        "first_job_of_worker_elapsed_s": med([r["elapsed_s"] for r in ok if r["worker_job"] == 1]),
        "later_jobs_elapsed_s": med([r["elapsed_s"] for r in ok if r["worker_job"] > 1]),
        "worker_processes": len({r["pid"] for r in rows}),
    }


def _machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    python = platform.python_version()
    return f"{platform.platform()}, {model}, {os.cpu_count()} CPUs visible, Python {python}"


def _gpu_names() -> str:
    if shutil.which("nvidia-smi") is None:
        return "none (no nvidia-smi)"
    q = ["nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader"]
    return "; ".join(subprocess.run(q, capture_output=True, text=True).stdout.strip().splitlines())


if __name__ == "__main__":
    main()
