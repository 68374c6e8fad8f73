"""Every GPU of one node (``hydra/launcher=node_gpus``): one job per GPU at a time, each in its own
process pinned to its GPU through ``CUDA_VISIBLE_DEVICES``.

The launcher keeps a pool of free GPUs. A job starts when a GPU is free, in a new Python process
whose ``CUDA_VISIBLE_DEVICES`` names that GPU alone, so the job sees one device (``cuda:0``, what
``device=auto`` picks) and two jobs never share a GPU. When the process ends its GPU goes back to
the pool. A job that crashes (segfault, CUDA error, killed) ends only its own process; the other
jobs go on and the sweep's summary names it.

Files under ``<hydra.sweep.dir>``: ``node_gpus.jsonl``, one line per finished job (number,
overrides, GPU, pid, start, end, status); ``.node_gpus/<num>.pkl`` (the job: its config, the task
function and Hydra's state, cloudpickled), ``<num>.out`` (its result) and ``<num>.log`` (its stdout
and stderr). ``python -m hydra_plugins.s2o_launchers.node_gpus <num>.pkl`` is a job's process.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from .report import failure, finish

log = logging.getLogger(__name__)


def pick_gpus(
    gpus: Sequence[int] | str | None, env: Mapping[str, str], count: Callable[[], int]
) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each GPU the launcher hands out.

    The visible GPUs are the entries of ``env["CUDA_VISIBLE_DEVICES"]`` when it is set (indices,
    UUIDs or MIG ids, passed on as given; CUDA ignores everything from the first negative entry
    on), else ``0 .. count() - 1``. ``gpus=None`` takes all of them; a list of positions takes
    those (position 0 is the first visible GPU, the one ``cuda:0`` names).
    """
    if "CUDA_VISIBLE_DEVICES" in env:
        visible = []
        for token in (t.strip() for t in env["CUDA_VISIBLE_DEVICES"].split(",")):
            if not token or token.startswith("-"):
                break
            visible.append(token)
    else:
        visible = [str(i) for i in range(count())]
    if gpus is None:
        chosen = visible
    else:
        positions = [int(g) for g in (gpus.split(",") if isinstance(gpus, str) else gpus)]
        if len(set(positions)) != len(positions) or not all(
            0 <= p < len(visible) for p in positions
        ):
            raise ValueError(
                f"node_gpus: gpus={positions} must be distinct positions among the "
                f"{len(visible)} visible GPUs {visible}"
            )
        chosen = [visible[p] for p in positions]
    if not chosen:
        raise ValueError(
            "node_gpus: no GPU is visible (CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES')!r}); on a CPU use hydra/launcher=local"
        )
    return chosen


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


# NamedTuple, not dataclass: Hydra's plugin scan executes this module before registering it in
# sys.modules, where dataclasses look up string annotations.
class _Job(NamedTuple):
    num: int
    overrides: list[str]
    pkl: Path


class _Running(NamedTuple):
    job: _Job
    gpu: str
    proc: subprocess.Popen
    start: float


class NodeGpusLauncher(Launcher):
    """One job per GPU at a time; see the module docstring."""

    def __init__(self, gpus: Sequence[int] | str | None = None, poll_s: float = 0.2) -> None:
        self.gpus = None if gpus is None else (gpus if isinstance(gpus, str) else list(gpus))
        self.poll_s = poll_s
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        (sweep_dir / ".node_gpus").mkdir(parents=True, exist_ok=True)
        gpus = pick_gpus(self.gpus, os.environ, _cuda_count)
        log.info(
            f"node_gpus: {len(job_overrides)} jobs, one at a time on each of the GPUs "
            f"{gpus} (CUDA_VISIBLE_DEVICES values)"
        )
        jobs = [
            self._prepare(sweep_dir, list(o), initial_job_idx + i)
            for i, o in enumerate(job_overrides)
        ]
        rets = self._run(jobs, gpus, sweep_dir / "node_gpus.jsonl")
        return finish(job_overrides, rets, initial_job_idx)

    def _prepare(self, sweep_dir: Path, overrides: list[str], num: int) -> _Job:
        """Write the job's pickle: what joblib's launcher sends its workers."""
        import cloudpickle  # the task function is usually defined in __main__: pickled by value

        assert self.hydra_context is not None and self.config is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = f"{config.hydra.job.name}_{num}"
            config.hydra.job.num = num
        payload = {
            "hydra_context": self.hydra_context,
            "task_function": self.task_function,
            "config": config,
            "singleton_state": Singleton.get_state(),
        }
        pkl = sweep_dir / ".node_gpus" / f"{num}.pkl"
        pkl.write_bytes(cloudpickle.dumps(payload))
        return _Job(num, overrides, pkl)

    def _run(self, jobs: list[_Job], gpus: list[str], ledger: Path) -> list[JobReturn]:
        """Start each job when a GPU is free; collect every job's return, in order."""
        free, pending = deque(gpus), deque(jobs)
        running: list[_Running] = []
        rets: dict[int, JobReturn] = {}
        # SIGTERM (timeout, kill) ends the sweep through the finally below, jobs included
        previous = signal.signal(signal.SIGTERM, _terminated)
        try:
            while pending or running:
                while free and pending:
                    running.append(_start(pending.popleft(), free.popleft()))
                time.sleep(self.poll_s)
                for run in [r for r in running if r.proc.poll() is not None]:
                    running.remove(run)
                    free.append(run.gpu)
                    rets[run.job.num] = _collect(run, ledger)
        finally:
            for run in running:  # interrupted (Ctrl-C, SIGTERM): no job outlives the sweep
                _stop(run.proc)
            signal.signal(signal.SIGTERM, previous)
        return [rets[job.num] for job in jobs]


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _start(job: _Job, gpu: str) -> _Running:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
    # The job's process imports what this one imports (the task function's modules) from the same
    # places, wherever the sweep was started from.
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    cmd = [sys.executable, "-m", __name__, str(job.pkl)]
    with open(job.pkl.with_suffix(".log"), "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    log.info(f"\t#{job.num} on GPU {gpu} (pid {proc.pid}): {' '.join(job.overrides)}")
    return _Running(job, gpu, proc, time.time())


def _collect(run: _Running, ledger: Path) -> JobReturn:
    """The job's JobReturn from its ``.out`` file (FAILED if the process died before writing it);
    appends the job's line to the ledger."""
    end, code = time.time(), run.proc.returncode
    out = run.job.pkl.with_suffix(".out")
    result = pickle.loads(out.read_bytes()) if out.exists() else None
    ret = JobReturn(overrides=run.job.overrides, status=JobStatus.COMPLETED)
    if result is None:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        ret.status = JobStatus.FAILED
        ret._return_value = RuntimeError(
            f"process {how} before reporting; log: {run.job.pkl.with_suffix('.log')}"
        )
    else:
        ret.status, ret._return_value = JobStatus[result["status"]], result["value"]
    why = failure(ret)
    line = {
        "num": run.job.num,
        "overrides": run.job.overrides,
        "gpu": run.gpu,
        "gpu_seen_by_job": (result or {}).get("cuda_visible_devices"),
        "pid": run.proc.pid,
        "start": _iso(run.start),
        "end": _iso(end),
        "elapsed_s": round(end - run.start, 3),
        "returncode": code,
        "status": "ok" if why is None else "failed",
        "why": why,
        "log": str(run.job.pkl.with_suffix(".log")),
    }
    with open(ledger, "a") as f:
        f.write(json.dumps(line) + "\n")
    log.info(
        f"\t#{run.job.num} {line['status']} on GPU {run.gpu} in {line['elapsed_s']:.1f} s"
        + (f": {why}" if why else "")
    )
    return ret


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def work(pkl: Path) -> int:
    """A job's process: run the pickled job as Hydra's joblib worker does, write its result."""
    import cloudpickle

    payload = cloudpickle.loads(pkl.read_bytes())
    setup_globals()
    Singleton.set_state(payload["singleton_state"])
    config = payload["config"]
    HydraConfig.instance().set_config(config)
    ret = run_job(
        hydra_context=payload["hydra_context"],
        task_function=payload["task_function"],
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    if ret.status == JobStatus.FAILED:
        traceback.print_exception(ret._return_value)
    result = {
        "status": ret.status.name,
        "value": ret._return_value,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        data = cloudpickle.dumps(result)
    except Exception as exc:  # noqa: BLE001  (an unpicklable value is reported, not lost)
        result["value"] = RuntimeError(f"unpicklable job result {result['value']!r}: {exc}")
        data = cloudpickle.dumps(result)
    tmp = pkl.with_suffix(".out.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, pkl.with_suffix(".out"))
    return 0 if ret.status == JobStatus.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(work(Path(sys.argv[1])))
