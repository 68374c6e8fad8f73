"""What every experiment kind shares: device choice, run identity, records, timing, W&B."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .provenance import git_revision

ROOT = Path(__file__).resolve().parents[1]
# Keys that do not change what is computed: left out of a run's identity (its hash).
NOT_IDENTITY = (
    "wandb", "results_dir", "skip_done", "progress", "git_rev", "tiny", "dry_run", "name",
)  # fmt: skip
# An operator point is identified by its method knobs, so the top-level tau/S (interpolated into
# them, ignored by other methods) and the sweep/matched blocks are left out as well.
NOT_POINT_IDENTITY = NOT_IDENTITY + ("tau", "S", "sweep", "matched")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class JobContext:
    """Hydra facts a job needs; filled by run.py from HydraConfig (or a composed cfg.hydra)."""

    method: str
    multirun: bool = False
    job_num: int = 0
    overrides: list[str] = field(default_factory=list)


def resolve_device(name: str, ctx: JobContext) -> torch.device:
    """``auto``: CUDA when present (multirun job ``j`` on GPU ``j % count``), else CPU."""
    if name not in ("auto", "cpu", "cuda") and not name.startswith("cuda:"):
        raise ValueError(f"device={name!r} is not one of auto, cpu, cuda, cuda:<index>")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if name == "auto":
            return torch.device("cpu")
        raise ValueError(f"device={name} but CUDA is not available here; use device=cpu or auto")
    if name == "auto":
        index = ctx.job_num % torch.cuda.device_count() if ctx.multirun else 0
        return torch.device("cuda", index)
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolved_config(cfg: DictConfig, ctx: JobContext) -> dict:
    """Plain, fully resolved config with ``method_name`` and the concrete device/dtype filled in."""
    out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    out.pop("hydra", None)
    device = resolve_device(out["device"], ctx)
    out["device"] = str(device)
    out["dtype"] = str(resolve_dtype(out["dtype"], device)).removeprefix("torch.")
    out["method_name"] = ctx.method
    return out


def identity(resolved: dict, drop: tuple[str, ...]) -> str:
    """12 hex digits of the SHA-256 of the config without ``drop`` keys (the run's identity)."""
    kept = {k: v for k, v in resolved.items() if k not in drop}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def point_record_path(resolved: dict) -> Path:
    rid = identity(resolved, NOT_POINT_IDENTITY)
    return Path(resolved["results_dir"]) / "runs" / resolved["method_name"] / rid / "record.json"


def experiment_record_path(resolved: dict) -> Path:
    rid = identity(resolved, NOT_IDENTITY)
    return Path(resolved["results_dir"]) / "experiments" / resolved["name"] / rid / "record.json"


def environment(device: torch.device, git_rev: str | None) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "device": str(device),
        "device_name": name or platform.machine(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_revision": git_revision(git_rev),
        "hostname": socket.gethostname(),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_threads": torch.get_num_threads(),
    }


def write_record(path: Path, record: dict) -> None:
    """Write ``record`` as JSON atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def read_record(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def execute(resolved: dict, path: Path, body: Callable[[], dict]) -> tuple[dict, bool]:
    """Run ``body`` unless ``path`` holds an ok record; always leave a record behind.

    Returns ``(record, skipped)``. An exception in ``body`` becomes a record with status
    ``error`` and the traceback; it is not re-raised (the caller decides the exit code).
    """
    done = read_record(path)
    if resolved["skip_done"] and done is not None and done.get("status") == "ok":
        return done, True
    device = torch.device(resolved["device"])
    record = {
        "status": "ok",
        "id": path.parent.name,
        "kind": resolved["kind"],
        "method": resolved["method_name"],
        "config": resolved,
        "environment": environment(device, resolved["git_rev"]),
    }
    t0 = time.perf_counter()
    try:
        record["metrics"] = body()
    except Exception as exc:  # noqa: BLE001  (recorded with traceback; the sweep goes on)
        record.update(status="error", error=f"{type(exc).__name__}: {exc}")
        record["traceback"] = traceback.format_exc()
    record["elapsed_s"] = round(time.perf_counter() - t0, 3)
    write_record(path, record)
    return record, False


def bench_ms(fn: Callable[[], object], device: torch.device, timing: dict) -> float:
    """Median milliseconds of ``fn``: ``do_bench`` on CUDA, wall-clock over ``rep`` calls on CPU.

    On the CPU the untimed warm-up calls number ``timing.warmup``.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        with torch.cuda.device(device):
            return float(
                do_bench(
                    fn,
                    warmup=timing["cuda_warmup_ms"],
                    rep=timing["cuda_rep_ms"],
                    return_mode="median",
                )  # fmt: skip
            )
    for _ in range(timing["warmup"]):
        fn()
    times = []
    for _ in range(max(1, timing["rep"])):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class WandbLogger:
    """One W&B run per job (``mode``: offline | online | disabled); a no-op when disabled."""

    def __init__(self, wandb_cfg: dict, resolved: dict, name: str):
        self.run = None
        if wandb_cfg["mode"] == "disabled":
            return
        import wandb

        Path(wandb_cfg["dir"]).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            mode=wandb_cfg["mode"], project=wandb_cfg["project"], entity=wandb_cfg["entity"],
            group=wandb_cfg["group"], tags=list(wandb_cfg["tags"]), dir=wandb_cfg["dir"],
            name=name, config=resolved, reinit="finish_previous",
        )  # fmt: skip

    def log(self, values: dict, step: int | None = None) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in values.items() if isinstance(v, int | float)}, step=step)

    def summary(self, values: dict) -> None:
        if self.run is not None:
            for k, v in values.items():
                if isinstance(v, int | float | str):
                    self.run.summary[k] = v

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
