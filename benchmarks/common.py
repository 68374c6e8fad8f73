"""What every benchmark script shares: its command line, its input, its timer and its record.

* Input: :func:`make_qkv`, the harness's seeded generator (``eval/synthetic.py``) at the knobs of
  ``conf/data/synthetic.yaml`` (``--input synthetic``, the defaults) or of
  ``conf/data/synthetic_calibrated.yaml`` (``--input calibrated``), so the kernel, baseline and
  retrieval numbers rest on the same inputs as the harness's operator runs.
* Timer: :func:`experiments.timing.bench_ms` (``do_bench`` median, CUDA events; wall clock on the
  CPU), the harness's.
* Record: the harness's schema (``status``, ``kind``, ``id``, ``config``, ``identity``,
  ``environment`` from :func:`experiments.provenance.environment`, ``metrics``, ``elapsed_s``)
  with ``kind: benchmark``, the benchmark's name and the command line that made it, written to
  ``<out>/<benchmark>/<id>/record.json`` after every measured part (``status: partial`` until the
  run ends, so a run cut off keeps what it measured).
* ``--smoke``: a tiny CPU run under the Triton interpreter (fp32, a few tokens) that checks the
  script end to end; its times mean nothing. The interpreter must be switched on before Triton
  decorates the kernels, so a script calls :func:`early_smoke_switch` before importing ``s2o``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INPUTS = {
    "synthetic": "conf/data/synthetic.yaml",
    "calibrated": "conf/data/synthetic_calibrated.yaml",
}
# knobs of eval.synthetic.SyntheticSpec that a conf/data file sets (the shape comes from the script)
_SHAPE_KEYS = ("source", "L", "batch", "heads_q", "heads_kv", "head_dim", "seed")


def early_smoke_switch(argv: list[str] | None = None) -> bool:
    """``--smoke`` on the command line: set ``TRITON_INTERPRET=1`` (before any kernel import)."""
    smoke = "--smoke" in (sys.argv[1:] if argv is None else argv)
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return smoke


def add_common_args(ap: argparse.ArgumentParser, default_heads: str = "32/8") -> None:
    ap.add_argument("--out", default="results/benchmarks", help="records go to <out>/<name>/<id>/")
    ap.add_argument("--rev", default=None, help="git revision (a copied tree may have no .git)")
    ap.add_argument("--input", choices=sorted(INPUTS), default="synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", default=default_heads, help="query/key-value heads, e.g. 32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run under the interpreter")


@dataclass(frozen=True)
class Shape:
    """The shape, dtype and device of a benchmark's inputs (the length varies per row)."""

    B: int
    Hq: int
    Hkv: int
    D: int
    dtype: str
    device: str

    @staticmethod
    def from_args(args: argparse.Namespace) -> Shape:
        """The paper's shape on the GPU (bf16); with ``--smoke`` 2 query / 1 KV heads, D=16, fp32
        on the CPU."""
        if args.smoke:
            return Shape(B=1, Hq=2, Hkv=1, D=16, dtype="float32", device="cpu")
        hq, hkv = (int(x) for x in args.heads.split("/"))
        if hkv <= 0 or hq % hkv:
            raise ValueError(f"--heads {args.heads}: query heads must be a multiple of KV heads")
        return Shape(B=1, Hq=hq, Hkv=hkv, D=args.head_dim, dtype="bfloat16", device="cuda")

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)


def input_knobs(name: str) -> dict:
    """The structure knobs of ``--input name``: ``{}`` for ``synthetic`` (``SyntheticSpec``'s
    defaults, which are conf/data/synthetic.yaml's), else its conf/data file without the shape
    keys (read with PyYAML)."""
    if name not in INPUTS:
        raise ValueError(f"--input {name!r} is not one of {sorted(INPUTS)}")
    if name == "synthetic":
        return {}
    import yaml

    data = yaml.safe_load((ROOT / INPUTS[name]).read_text())
    return {k: v for k, v in data.items() if k not in _SHAPE_KEYS}


def make_qkv(name: str, shape: Shape, L: int, seed: int):
    """``q [B, Hq, L, D]``, ``k``, ``v`` ``[B, Hkv, L, D]`` of ``--input name`` on the benchmark's
    device and dtype (drawn on the CPU in fp64 by ``eval.synthetic``, then cast and moved)."""
    from eval.synthetic import SyntheticSpec, synthetic_qkv

    spec = SyntheticSpec(L=L, batch=shape.B, heads_q=shape.Hq, heads_kv=shape.Hkv,
                         head_dim=shape.D, seed=seed, **input_knobs(name))  # fmt: skip
    return synthetic_qkv(spec, dtype=shape.torch_dtype, device=shape.device)


def timer(shape: Shape, warmup_ms: float = 25.0, rep_ms: float = 200.0) -> Callable[..., float]:
    """``bench(fn) -> median ms`` with the given ``do_bench`` budget (on the CPU one timed call and
    no warm-up: a smoke run checks the code, not the time, and the interpreter makes each call
    cost seconds)."""
    import torch

    from experiments.timing import bench_ms

    timing = {"cuda_warmup_ms": warmup_ms, "cuda_rep_ms": rep_ms, "warmup": 0, "rep": 1}
    device = torch.device(shape.device)
    return lambda fn: bench_ms(fn, device, timing)


def model_config(name: str, *, path: str | None = None, gguf_file: str | None = None,
                 yarn: bool = False, weights: str | None = None) -> dict:  # fmt: skip
    """A script's model config: ``conf/model/<name>.yaml`` with its command-line overrides
    (``--model-path``, ``--gguf-file``, ``--yarn``, ``--weights``), the models cached under the
    repository's ``cache/models``, normalized (:func:`eval.models.normalize`). An unknown name is
    refused naming it and the known ones."""
    import yaml

    from eval import models

    conf = ROOT / "conf" / "model"
    file = conf / f"{name}.yaml"
    if not file.is_file():
        known = ", ".join(sorted(f.stem for f in conf.glob("*.yaml")))
        raise SystemExit(f"--model {name!r}: no conf/model/{name}.yaml (known: {known})")
    cfg = yaml.safe_load(file.read_text())
    cfg.update({k: v for k, v in (("path", path), ("gguf_file", gguf_file), ("weights", weights))
                if v})  # fmt: skip
    cfg["yarn"] = bool(yarn) or cfg.get("yarn", False)
    cfg["cache_dir"] = str(ROOT / "cache" / "models")
    return models.normalize(cfg)


def command_line(module: str, argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", module, *(shlex.quote(a) for a in args)])


def record_head(benchmark: str, config: dict, command: str, device, rev: str | None) -> dict:
    """A benchmark record's fields before its metrics: id (``experiments.records.benchmark_id`` of
    the config, code revision and GPU model), kind, benchmark, command, config, identity and
    environment; every benchmark record starts from this (:class:`Recorder`, one-shot scripts)."""
    from experiments.provenance import code_revision, environment
    from experiments.records import benchmark_id

    env = environment(device, rev)
    code = code_revision(rev)
    digest = benchmark_id(config, code, env["device_name"])
    return {
        "id": digest, "kind": "benchmark", "benchmark": benchmark, "command": command,
        "config": config, "identity": {"code": code, "device_model": env["device_name"],
                                       "id": digest},
        "environment": env,
    }  # fmt: skip


@dataclass
class Recorder:
    """One benchmark run's record; :meth:`save` rewrites it (call it after every part)."""

    benchmark: str
    config: dict
    command: str
    shape: Shape
    out: Path
    rev: str | None = None
    metrics: dict = field(default_factory=dict)

    def __post_init__(self):
        import torch

        from experiments.provenance import is_tracked
        from experiments.records import benchmark_record_path

        self.t0 = time.perf_counter()
        self.config = {**self.config, "shape": asdict(self.shape)}
        head = record_head(self.benchmark, self.config, self.command,
                           torch.device(self.shape.device), self.rev)  # fmt: skip
        self.record = {"status": "partial", **head, "metrics": self.metrics}
        self.path = benchmark_record_path(self.out, self.benchmark, head["id"])
        if self.path.exists() and is_tracked(self.path):
            raise SystemExit(f"{self.path} is a committed record: pass --out <another folder>")
        if self.path.exists():  # same config, code and GPU model: this run replaces it
            print(f"replacing {self.path} (an uncommitted record of the same run)", flush=True)

    def save(self, done: bool = False) -> Path:
        """Write the record atomically; ``done`` marks it ``ok``."""
        if done:
            self.record["status"] = "ok"
        from experiments.records import write_record

        self.record["elapsed_s"] = round(time.perf_counter() - self.t0, 3)
        write_record(self.path, self.record)
        return self.path


def free_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def log(row: dict) -> None:
    print(json.dumps(row, default=str), flush=True)
