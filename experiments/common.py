"""What every experiment kind shares: device choice, config checks, W&B. A run's identity, record
path, reuse and write live in :mod:`experiments.records`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError as ConfigError
from .errors import non_finite as non_finite

ROOT = Path(__file__).resolve().parents[1]
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
    cuda_index = isinstance(name, str) and name.startswith("cuda:") and name[5:].isdigit()
    if name not in ("auto", "cpu", "cuda") and not cuda_index:
        raise ConfigError(f"device={name!r} is not one of auto, cpu, cuda, cuda:<index>")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if name == "auto":
            return torch.device("cpu")
        raise ConfigError(f"device={name} but CUDA is not available here; use device=cpu or auto")
    if name == "auto":
        index = ctx.job_num % torch.cuda.device_count() if ctx.multirun else 0
        return torch.device("cuda", index)
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"dtype={name!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolved_config(cfg: DictConfig, ctx: JobContext) -> dict:
    """Plain, fully resolved config with ``method_name`` and the concrete device/dtype filled in."""
    out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    out.pop("hydra", None)
    check_types(out)
    device = resolve_device(out["device"], ctx)
    out["device"] = str(device)
    out["dtype"] = str(resolve_dtype(out["dtype"], device)).removeprefix("torch.")
    out["method_name"] = ctx.method
    return out


# Keys whose type is fixed (a string from the command line, e.g. seed=abc, fails here, named).
TYPES = {
    "seed": int, "S": int, "tau": float, "dry_run": bool, "skip_done": bool, "reuse_stale": bool,
    "progress": bool, "timing.enabled": bool, "timing.warmup": int, "timing.rep": int,
    "timing.cuda_warmup_ms": float, "timing.cuda_rep_ms": float, "e2e.reps": int,
    "e2e.warmup": int,
}  # fmt: skip
_TYPE_WORDS = {bool: "a bool (true/false)", int: "an int", float: "a number"}
# Counts and times with a floor: a value below it is refused (never clamped, which would record
# one number and measure another).
MINIMUMS = {
    "timing.warmup": 0, "timing.rep": 1, "timing.cuda_warmup_ms": 0, "timing.cuda_rep_ms": 0,
    "e2e.reps": 1, "e2e.warmup": 0,
}  # fmt: skip


def _has_type(value: object, typ: type) -> bool:
    if typ is bool or isinstance(value, bool):
        return isinstance(value, typ)
    return isinstance(value, (int, float) if typ is float else typ)


def check_types(resolved: dict) -> None:
    """Top-level and synthetic-data values of the wrong type, and counts below their
    :data:`MINIMUMS` -> :class:`ConfigError` naming the key (before any data is built)."""
    from eval.synthetic import SyntheticSpec

    wanted = dict(TYPES)
    if resolved["data"].get("source") == "synthetic":
        types = {"int": int, "float": float, "bool": bool, int: int, float: float, bool: bool}
        for f in dataclasses.fields(SyntheticSpec):
            if f.type in types:
                wanted[f"data.{f.name}"] = types[f.type]
    tree = OmegaConf.create(resolved)
    for key, typ in wanted.items():
        value = OmegaConf.select(tree, key, default=None)
        if value is not None and not _has_type(value, typ):
            raise ConfigError(f"{key}={value!r} must be {_TYPE_WORDS[typ]}")
    for key, low in MINIMUMS.items():
        value = OmegaConf.select(tree, key, default=None)
        if value is not None and value < low:
            raise ConfigError(f"{key}={value!r} must be >= {low}")


def check_writable(results_dir: str) -> None:
    """Fail before any computation when records could not be written."""
    d = Path(results_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".write_probe.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"results_dir={results_dir} is not writable ({exc.strerror or exc}): "
            "give a writable folder, e.g. results_dir=/tmp/s2o_results"
        ) from exc


def memory_available() -> int:
    """Bytes of memory available to a new allocation (MemAvailable on Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def point_shape(resolved: dict) -> tuple[int, int, int, int, int]:
    """``(B, Hq, Hkv, L, D)`` of a point's inputs, from the config alone (before building them);
    unknown sizes (a model's heads before its capture) count as 1: a lower bound."""
    data = resolved["data"]
    L = int(data.get("L") or 0)
    if data.get("source") == "synthetic":
        return data["batch"], data["heads_q"], data["heads_kv"], L, data["head_dim"]
    if data.get("source") == "file" and Path(str(data.get("path"))).is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(data["path"]), framework="pt") as f:
                qname = next(k for k in f.keys() if k.startswith("q."))
                B, Hq, Lf, D = f.get_slice(qname).get_shape()
                Hkv = f.get_slice("k" + qname[1:]).get_shape()[1]
        except Exception:  # noqa: BLE001  (unreadable files fail later, naming the file)
            return 1, 1, 1, L, 1
        return B, Hq, Hkv, min(L or Lf, Lf), D
    return 1, 1, 1, L, 128


def check_memory(resolved: dict) -> None:
    """On a CPU, refuse a point whose dense reference would not fit, naming the size.

    Full on the CPU is PyTorch's math SDPA: it materialises the ``B x Hq x L x L`` fp32 scores and
    their softmax; the inputs come on top. A paper-scale point (128K tokens) needs hundreds of GiB.
    """
    if torch.device(resolved["device"]).type != "cpu":
        return
    B, Hq, Hkv, L, D = point_shape(resolved)
    data = resolved["data"]
    layers = 1 if data.get("source") == "synthetic" else len(data.get("layers") or [0])
    need = 2 * 4 * B * Hq * L * L + 4 * layers * B * (Hq + 2 * Hkv) * L * D
    have = memory_available()
    if need > 0.8 * have:
        raise ConfigError(
            f"this point needs about {need / 2**30:.0f} GiB on the CPU (dense reference at "
            f"L={L}, B={B}, Hq={Hq}: {B}x{Hq}x{L}x{L} fp32 scores, twice) but "
            f"{have / 2**30:.0f} GiB are available: run it on a GPU (device=cuda) or at a tiny "
            "size (dry_run=true, or a smaller data.L)"
        )


class WandbLogger:
    """One W&B run per job (``mode``: offline | online | disabled); a no-op when disabled. W&B's
    own console lines (about 20 a job) are shown only with ``wandb.verbose=true``."""

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
            settings=wandb.Settings(silent=not wandb_cfg.get("verbose", False)),
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
