"""Every GPU of one node (``hydra/launcher=node_gpus``): one job per GPU at a time (or
``jobs_per_gpu`` at a time), each GPU served by its own worker process(es) pinned to it through
``CUDA_VISIBLE_DEVICES``.

``jobs_per_gpu=k`` starts k workers per GPU. They run k jobs on it at once, for work that leaves a
GPU mostly idle (a small model's batch-1 decoding in an accuracy sweep). Their times are shared,
so it is not for latency measurements: each worker gets ``S2O_JOBS_PER_GPU=k``, which records
write in their ``environment`` block, beside ``gpu_processes``.

The launcher starts one worker per GPU, a Python process whose ``CUDA_VISIBLE_DEVICES`` names that
GPU alone (set before it imports anything), so its jobs see one device (``cuda:0``, what
``device=auto`` picks) and two jobs never share a GPU. A worker runs the jobs it is handed one
after another: with ``reuse_workers=true`` (the default) it lives for the whole sweep, so the
interpreter start, the imports (torch, Triton, transformers), the CUDA context and Triton's
compiled kernels are paid once per GPU instead of once per job; with ``reuse_workers=false`` it
serves one job and exits, and the next job gets a new process (slower, but nothing a job leaves
behind, leaked GPU memory or module state, can reach the next one).

Each worker is also pinned to its own block of the launcher's CPUs (``cpus_per_worker``, default
``auto``: an even split; its OpenMP/MKL/OpenBLAS pools sized to the block), so jobs that work on
the host (building inputs) do not fight over the same cores; the ledger names each job's CPUs.

Between two jobs a reused worker puts back the working directory, the environment variables, the
logging setup (handlers a job added are closed, levels restored) and the warnings filters, and
frees PyTorch's cached GPU memory; each job gets Hydra's state, config and job number as in
Hydra's joblib launcher. A job that raises (or calls ``sys.exit``) is reported failed and the
worker goes on; a job that kills its worker (segfault, ``os._exit``, SIGKILL, a CUDA abort) is
reported failed and a new worker takes the GPU's next job; the other GPUs go on, and the sweep's
summary names every failed point. Ctrl-C or SIGTERM of the sweep stops the workers (each runs in
its own process group, which is stopped whole) and a worker whose launcher died exits as well.

Files under ``<hydra.sweep.dir>``: ``node_gpus.jsonl``, one line per finished job (number,
overrides, GPU, worker pid, the worker's job count, start, end, status);
``.node_gpus/<num>.pkl`` (the job: its config, the task function and Hydra's state,
cloudpickled), ``<num>.out`` (its result) and ``<num>.log`` (its stdout and stderr, the worker's
file descriptors 1 and 2 while it ran). ``python -m hydra_plugins.s2o_launchers.node_gpus`` is a
worker: it reads one ``<num>.pkl`` path per line on stdin and answers ``done <num>`` on its
original stdout once ``<num>.out`` is written; it exits at the end of stdin.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import gc
import json
import logging
import os
import pickle
import selectors
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from experiments.provenance import JOBS_PER_GPU_ENV  # records write it in their environment

from .report import failure, finish, preflight

log = logging.getLogger(__name__)

# the launcher's pid, given to its workers: a worker whose parent is already gone exits at once
_PARENT_ENV = "S2O_NODE_GPUS_LAUNCHER_PID"


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


def cpu_sets(
    cpus_per_worker: int | str | None, workers: int, available: Sequence[int]
) -> list[list[int]] | None:
    """The CPUs each worker is pinned to: disjoint blocks of the launcher's own CPUs.

    ``"auto"`` splits them evenly (the remainder stays unused; with fewer CPUs than workers, each
    worker gets one, shared round-robin); an integer n gives each worker n of them and refuses more
    than there are; None pins nothing (every job sees every CPU, and their thread pools compete).
    """
    if _check_cpus_per_worker(cpus_per_worker) is None:
        return None
    cpus = sorted(available)
    if cpus_per_worker == "auto":
        n = len(cpus) // workers
        if n == 0:
            return [[cpus[i % len(cpus)]] for i in range(workers)]
    else:
        n = cpus_per_worker
        if n * workers > len(cpus):
            raise ValueError(
                f"node_gpus: cpus_per_worker={n} for {workers} workers needs {n * workers} "
                f"CPUs, and this launcher may use {len(cpus)}"
            )
    return [cpus[i * n : (i + 1) * n] for i in range(workers)]


def _check_cpus_per_worker(value: int | str | None) -> int | str | None:
    """``value`` if it is ``"auto"``, None or an integer >= 1; else ValueError naming it."""
    if value in (None, "auto"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"node_gpus: cpus_per_worker={value!r} must be auto, null or an integer >= 1"
        )
    return value


def _own_cpus(cpus_per_worker: int | str | None) -> list[int]:
    """The CPUs this launcher may run on (its affinity: a SLURM allocation, ``taskset``)."""
    if not hasattr(os, "sched_getaffinity"):  # macOS, Windows: no CPU affinity to split
        if cpus_per_worker is None:
            return []
        raise ValueError(
            f"node_gpus: cpus_per_worker={cpus_per_worker!r} pins workers to CPUs, which this OS "
            "does not support; set hydra.launcher.cpus_per_worker=null"
        )
    return sorted(os.sched_getaffinity(0))


# thread pools that size themselves from the machine, not from the process's CPUs
_THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class _Worker:
    """The launcher's side of one GPU: its worker process (None between two processes), the job
    it runs (None when idle) and how many jobs the process was handed."""

    def __init__(self, gpu: str, share: int = 1, cpus: list[int] | None = None) -> None:
        self.gpu, self.share, self.cpus = gpu, share, cpus
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.served = 0
        self.job: _Job | None = None
        self.start = 0.0
        self.died = False
        self.buf = b""

    def spawn(self) -> None:
        """A new worker process that sees this GPU alone, in its own process group."""
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.gpu)
        env.update({_PARENT_ENV: str(os.getpid()), JOBS_PER_GPU_ENV: str(self.share)})
        # The worker imports what this process imports (the task function's modules) from the
        # same places, wherever the sweep was started from.
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        cpus, pin = self.cpus, None
        if cpus is not None:  # pinned before exec: every thread the worker starts inherits it
            env.update({k: str(len(cpus)) for k in _THREAD_ENVS if k not in os.environ})

            def pin() -> None:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=pin,
        )
        self.pid, self.served, self.died, self.buf = self.proc.pid, 0, False, b""

    def hand(self, job: _Job) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.job, self.start = job, time.time()
        self.served += 1
        log.info(
            f"\t#{job.num} on GPU {self.gpu} (worker pid {self.proc.pid}, its job "
            f"{self.served}): {' '.join(job.overrides)}"
        )
        try:
            self.proc.stdin.write(f"{job.pkl}\n".encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the worker is gone: its pipe's end of file reports the job failed

    def job_ended(self, readable: bool) -> bool:
        """Whether the running job ended: the worker said ``done`` or died."""
        assert self.proc is not None and self.proc.stdout is not None and self.job is not None
        if readable:
            data = os.read(self.proc.stdout.fileno(), 4096)
            if not data:  # end of file: the worker died
                self.died = True
                return True
            self.buf += data
            lines = self.buf.split(b"\n")
            self.buf = lines.pop()
            return f"done {self.job.num}".encode() in lines
        # a worker that died while a child it forked holds its pipe open gives no end of file
        self.died = _exited(self.proc.pid)
        return self.died

    def release(self, sel: selectors.BaseSelector) -> None:
        """No more jobs: the worker exits at the end of its stdin (reaped by :meth:`retire`)."""
        assert self.proc is not None and self.proc.stdin is not None
        with contextlib.suppress(KeyError):  # released before
            sel.unregister(self.proc.stdout)
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()

    def send(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (the worker and its job's children)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def retire(self, sel: selectors.BaseSelector, grace_s: float) -> int:
        """End the worker process: end of its stdin, ``grace_s`` to exit, then its process group
        is killed (children a job left behind, or a worker that did not exit); its exit code."""
        assert self.proc is not None and self.proc.stdout is not None
        self.release(sel)
        code = _end(self.proc, grace_s)
        self.proc.stdout.close()
        self.proc = None
        return code


class NodeGpusLauncher(Launcher):
    """One worker per GPU, one job at a time on each; see the module docstring."""

    def __init__(
        self,
        gpus: Sequence[int] | str | None = None,
        reuse_workers: bool = True,
        poll_s: float = 0.2,
        jobs_per_gpu: int = 1,
        cpus_per_worker: int | str | None = "auto",
    ) -> None:
        if not isinstance(reuse_workers, bool):
            raise ValueError(f"node_gpus: reuse_workers={reuse_workers!r} must be true or false")
        if isinstance(jobs_per_gpu, bool) or not isinstance(jobs_per_gpu, int) or jobs_per_gpu < 1:
            raise ValueError(f"node_gpus: jobs_per_gpu={jobs_per_gpu!r} must be an integer >= 1")
        self.jobs_per_gpu = jobs_per_gpu
        self.cpus_per_worker = _check_cpus_per_worker(cpus_per_worker)
        self.gpus = None if gpus is None else (gpus if isinstance(gpus, str) else list(gpus))
        self.reuse_workers = reuse_workers
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
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        (sweep_dir / ".node_gpus").mkdir(parents=True, exist_ok=True)
        try:
            gpus = pick_gpus(self.gpus, os.environ, _cuda_count)
        except ValueError as e:  # one line, as run.py refuses a job, not Hydra's traceback
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        preflight(
            self.hydra_context, self.config, self.task_function, job_overrides, initial_job_idx
        )
        k = self.jobs_per_gpu
        how = "reused worker processes" if self.reuse_workers else "one process per job"
        at_once = "one at a time" if k == 1 else f"{k} at a time (sharing it: times are not clean)"
        log.info(
            f"node_gpus: {len(job_overrides)} jobs, {at_once} on each of the GPUs "
            f"{gpus} (CUDA_VISIBLE_DEVICES values), {how}"
        )
        jobs = [
            self._prepare(sweep_dir, list(o), initial_job_idx + i)
            for i, o in enumerate(job_overrides)
        ]
        rets = self._run(jobs, gpus, sweep_dir / "node_gpus.jsonl")
        return finish(job_overrides, rets, initial_job_idx, self.task_function)

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
        # an earlier sweep's result in this folder is not this job's
        pkl.with_suffix(".out").unlink(missing_ok=True)
        pkl.write_bytes(cloudpickle.dumps(payload))
        return _Job(num, overrides, pkl)

    def _run(self, jobs: list[_Job], gpus: list[str], ledger: Path) -> list[JobReturn]:
        """Hand each job to the first free GPU's worker; collect every job's return, in order."""
        k = self.jobs_per_gpu  # slot by slot, so the first jobs spread over the GPUs
        slots = [gpu for _ in range(k) for gpu in gpus]
        cpus = cpu_sets(self.cpus_per_worker, len(slots), _own_cpus(self.cpus_per_worker))
        if cpus is not None:
            log.info(f"node_gpus: worker CPUs {[_ranges(c) for c in cpus]}")
        pending = deque(jobs)
        workers = [_Worker(g, k, None if cpus is None else cpus[i]) for i, g in enumerate(slots)]
        rets: dict[int, JobReturn] = {}
        sel = selectors.DefaultSelector()
        # SIGTERM (timeout, kill) ends the sweep through the finally below, workers included
        previous = signal.signal(signal.SIGTERM, _terminated)
        finished = False
        try:
            for w in workers:
                self._next(w, pending, sel)
            while any(w.job is not None for w in workers):
                ready = {key.data for key, _ in sel.select(timeout=self.poll_s)}
                for w in workers:
                    if w.job is None or not w.job_ended(w in ready):
                        continue
                    code = w.retire(sel, 10.0) if w.died or not self.reuse_workers else None
                    rets[w.job.num] = _collect(w, code, ledger)
                    w.job = None
                    self._next(w, pending, sel)
            finished = True
        finally:
            if not finished:  # interrupted (Ctrl-C, SIGTERM): every worker's group is signalled
                for w in workers:  # first, so their grace periods run at once, not in turn
                    if w.proc is not None:
                        w.send(signal.SIGTERM)
            for w in workers:  # released workers exit; interrupted ones were stopped above
                if w.proc is not None:
                    w.retire(sel, 30.0 if finished else 10.0)
            sel.close()
            signal.signal(signal.SIGTERM, previous)
        return [rets[job.num] for job in jobs]

    def _next(self, w: _Worker, pending: deque[_Job], sel: selectors.BaseSelector) -> None:
        """Give the GPU of ``w`` the next job (a new worker if it has none), or release its
        worker, which exits while the other GPUs finish."""
        if not pending:
            if w.proc is not None:
                w.release(sel)
            return
        if w.proc is None:
            w.spawn()
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        w.hand(pending.popleft())


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited, without reaping it: while it is a zombie its pid,
    which is also its process group's id, cannot be reused, so signalling the group is safe."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _end(proc: subprocess.Popen, grace_s: float) -> int:
    """Give the worker ``grace_s`` to exit, kill what is left of its process group, and reap the
    worker; its exit code."""
    deadline = time.monotonic() + grace_s
    while not _exited(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def _collect(w: _Worker, code: int | None, ledger: Path) -> JobReturn:
    """The job's JobReturn from its ``.out`` file (FAILED if the worker died before writing it);
    appends the job's line to the ledger. ``code``: the worker's exit code if it has ended."""
    end, job = time.time(), w.job
    assert job is not None
    result, ret = _result(job.pkl.with_suffix(".out")), JobReturn(overrides=job.overrides)
    if result is None:
        how = "killed by " + signal.Signals(-code).name if code and code < 0 else f"exited ({code})"
        ret.status = JobStatus.FAILED
        log_file = job.pkl.with_suffix(".log")
        ret._return_value = RuntimeError(
            f"process {how} before reporting (worker pid {w.pid}); log: {log_file}"
        )
    else:
        ret.status, ret._return_value = JobStatus[result["status"]], result["value"]
    why = failure(ret)
    line = {
        "num": job.num,
        "overrides": job.overrides,
        "gpu": w.gpu,
        "jobs_per_gpu": w.share,
        "cpus": _ranges(w.cpus),
        "gpu_seen_by_job": (result or {}).get("cuda_visible_devices"),
        "pid": w.pid,
        "worker_job": w.served,
        "start": _iso(w.start),
        "end": _iso(end),
        "elapsed_s": round(end - w.start, 3),
        # in the worker: from the job's start (its modules imported) to its end
        "job_start": _iso((result or {}).get("job_start")),
        "job_end": _iso((result or {}).get("job_end")),
        "job_s": _span((result or {}).get("job_start"), (result or {}).get("job_end")),
        "returncode": code,
        "status": "ok" if why is None else "failed",
        "why": why,
        "log": str(job.pkl.with_suffix(".log")),
    }
    with open(ledger, "a") as f:
        f.write(json.dumps(line) + "\n")
    log.info(
        f"\t#{job.num} {line['status']} on GPU {w.gpu} in {line['elapsed_s']:.1f} s"
        + (f": {why}" if why else "")
    )
    return ret


def _result(out: Path) -> dict | None:
    """What the worker wrote to ``<num>.out``; None when it wrote nothing."""
    if not out.exists():
        return None
    try:
        return pickle.loads(out.read_bytes())
    except Exception as exc:  # noqa: BLE001  (a result that cannot be read is a failed job)
        return {"status": "FAILED", "value": RuntimeError(f"unreadable result {out}: {exc}")}


def _ranges(cpus: list[int] | None) -> str | None:
    """``[0, 1, 2, 5]`` as ``"0-2,5"`` (taskset's notation); None when not pinned."""
    if cpus is None:
        return None
    parts: list[list[int]] = []
    for c in cpus:
        if parts and c == parts[-1][1] + 1:
            parts[-1][1] = c
        else:
            parts.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


# ---------------------------------------------------------------- the worker process


def serve() -> int:
    """A worker: run each job named on stdin (one ``<num>.pkl`` path a line), answer ``done
    <num>`` on the original stdout once its ``<num>.out`` is written; return at the end of stdin."""
    _die_with_launcher()
    control = os.fdopen(os.dup(1), "w", buffering=1)
    jobs = os.fdopen(os.dup(0), "r")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # jobs get no stdin
    os.close(devnull)
    os.dup2(2, 1)  # output between jobs goes to the launcher's stderr, never into its pipe
    for line in jobs:
        pkl = Path(line.strip())
        with _output_to(pkl.with_suffix(".log")):
            result = _run_one(pkl)
            _write_result(pkl, result)
        control.write(f"done {pkl.stem}\n")
    return 0


def _die_with_launcher() -> None:
    """Linux: the kernel kills this worker when the launcher dies, even by SIGKILL (elsewhere the
    end of stdin ends it once its job is done)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    launcher = os.environ.pop(_PARENT_ENV, None)
    if launcher is not None and os.getppid() != int(launcher):
        sys.exit("node_gpus worker: the launcher is gone")


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """File descriptors 1 and 2 (Python's and C's output, child processes') go to ``path``."""
    _flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)  # C stdio buffers of extensions


def _run_one(pkl: Path) -> dict[str, Any]:
    """Run the pickled job as Hydra's joblib worker does; put back what it changed in this
    process (see :class:`_ProcessState`). A job that raises or calls ``sys.exit`` is FAILED."""
    start = time.time()
    try:
        import cloudpickle

        payload = cloudpickle.loads(pkl.read_bytes())  # imports the task's modules (once)
        start = time.time()  # the job's time is Hydra's and the task's, not the imports'
        setup_globals()
        Singleton.set_state(payload["singleton_state"])
        config = payload["config"]
        HydraConfig.instance().set_config(config)
        state = _ProcessState()
        try:
            ret = run_job(
                hydra_context=payload["hydra_context"],
                task_function=payload["task_function"],
                config=config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
        finally:
            state.restore()
        status, value = ret.status.name, ret._return_value
    except SystemExit as exc:
        status, value = "FAILED", RuntimeError(f"the job called sys.exit({exc.code!r})")
    except Exception as exc:  # noqa: BLE001  (the job fails, the worker goes on)
        status, value = "FAILED", exc
    if status == "FAILED" and isinstance(value, BaseException):
        traceback.print_exception(value)
    return {
        "status": status,
        "value": value,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
        "job_start": start,
        "job_end": time.time(),
    }


def _write_result(pkl: Path, result: dict[str, Any]) -> None:
    import cloudpickle

    try:
        data = cloudpickle.dumps(result)
    except Exception as exc:  # noqa: BLE001  (an unpicklable value is reported, not lost)
        result["value"] = RuntimeError(f"unpicklable job result {result['value']!r}: {exc}")
        data = cloudpickle.dumps(result)
    tmp = pkl.with_suffix(".out.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, pkl.with_suffix(".out"))


class _ProcessState:
    """What a job may change in the process that the next job in the same worker must not see:
    the working directory, environment variables, ``sys.stdout``/``sys.stderr``, warnings
    filters and logging (handlers, levels). Taken before a job, put back after it; the GPU
    memory PyTorch cached for the job is freed."""

    def __init__(self) -> None:
        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.streams = sys.stdout, sys.stderr
        self.warnings = list(warnings.filters)
        self.loggers = {name: _logger_state(lg) for name, lg in _loggers()}

    def restore(self) -> None:
        os.chdir(self.cwd)
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        _flush()
        sys.stdout, sys.stderr = self.streams
        warnings.filters[:] = self.warnings
        logging.disable(logging.NOTSET)
        for name, lg in _loggers():
            before = self.loggers.get(name)
            for handler in list(lg.handlers):
                # a job's handlers go (Hydra's file handler in the job's folder); NullHandlers
                # that libraries add when first imported stay
                if (before is None or handler not in before[3]) and not isinstance(
                    handler, logging.NullHandler
                ):
                    lg.removeHandler(handler)
                    handler.close()
            if before is not None:  # loggers made during the job keep their library's levels
                lg.setLevel(before[0])
                lg.propagate, lg.disabled = before[1], before[2]
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def _loggers() -> list[tuple[str, logging.Logger]]:
    named = logging.Logger.manager.loggerDict.items()
    return [("", logging.getLogger())] + [
        (name, lg) for name, lg in named if isinstance(lg, logging.Logger)
    ]


def _logger_state(lg: logging.Logger) -> tuple[int, bool, bool, list[logging.Handler]]:
    return lg.level, lg.propagate, lg.disabled, list(lg.handlers)


if __name__ == "__main__":
    sys.exit(serve())
