"""Where a model's prefill spends its GPU time, per kernel: torch.profiler over one warm prefill
per configuration (the plug-in's CUDA-event breakdown in ``kind=e2e`` says how much goes to
estimation, attention and the rest; this says which kernels inside them).

    python -m benchmarks.profile_prefill --model qwen25_coder_1p5b --model-path /data/qwen \\
        --gguf-file qwen.gguf --yarn --length 131072 --out results/e2e/qwen25_coder_1p5b \\
        --configs '[s2o, {name: full, backend: cudnn}]'

``--configs`` is a YAML list as ``e2e.methods`` takes it: method names (their defaults) or
mappings with ``name`` and knobs, e.g. ``'[s2o, {name: full, backend: cudnn}]'``, profiled one
after the other on one loaded model. The report (``profile_<model>_<L>_<config>.txt`` in ``--out``)
holds the environment, the profiled prefill's wall time, and the top GPU kernels by device time
with their share of all kernel time. Prompt: Paul Graham's essays in the model's tokens, as
``kind=e2e``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml

from benchmarks.common import model_config
from eval import models, texts
from experiments.provenance import environment
from s2o.hf import sparse_prefill

ROOT = Path(__file__).resolve().parent.parent


def _configs(text: str) -> list[tuple[str, str, dict]]:
    """``(label, method, knobs)`` of each entry of the ``--configs`` YAML list."""
    out = []
    for item in yaml.safe_load(text) or []:
        if isinstance(item, str):
            out.append((item, item, {}))
            continue
        knobs = dict(item)
        name = knobs.pop("name", None)
        if not isinstance(name, str):
            raise SystemExit(f"--configs entry {item!r}: a method name or a mapping with `name`")
        out.append((name + "".join(f"_{k}{v}" for k, v in sorted(knobs.items())), name, knobs))
    if not out:
        raise SystemExit("--configs: give at least one configuration")
    return out


def _prefill(model, ids):
    model(ids, use_cache=True, logits_to_keep=1)


def profile(model, ids, method: str, knobs: dict, top: int) -> tuple[str, float]:
    """``(report table, wall ms of the profiled prefill)`` of one warm prefill."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch.inference_mode(), sparse_prefill(model, method, **knobs):
        for _ in range(2):  # warm-up: Triton compilation, cuDNN plans
            _prefill(model, ids)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            _prefill(model, ids)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
    # GPU kernels only (an aten op's device time is its kernels' again); CUPTI's "Command Buffer
    # Full" marks a full launch queue, not GPU work
    events = [e for e in prof.key_averages()
              if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0
              and e.key != "Command Buffer Full"]  # fmt: skip
    total = sum(e.self_device_time_total for e in events)
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    rows = [f"{'self device ms':>15} {'share':>6} {'calls':>6}  kernel / op"]
    for e in events[:top]:
        ms = e.self_device_time_total / 1e3
        rows.append(f"{ms:>15.2f} {ms * 1e3 / total:>6.1%} {e.count:>6}  {e.key[:110]}")
    rows.append(f"{total / 1e3:>15.2f} {'100%':>6} {'':>6}  all GPU kernel time")
    return "\n".join(rows), wall


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a conf/model/*.yaml name")
    ap.add_argument("--model-path", help="a folder holding the GGUF (model.path)")
    ap.add_argument("--gguf-file", help="model.gguf_file, with --model-path")
    ap.add_argument("--yarn", action="store_true", help="model.yarn=true")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--configs", default="[s2o]", help="YAML list: names or {name: ..., knob: ...}")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--git-rev", help="the revision to record (a GPU copy of the tree)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_prefill profiles CUDA kernels: run it on a GPU")
    model_cfg = model_config(args.model, path=args.model_path, gguf_file=args.gguf_file,
                             yarn=args.yarn)  # fmt: skip
    context, where = models.context(model_cfg)
    if context is not None and args.length > context:
        raise SystemExit(f"--length {args.length} > the {context}-token context ({where})")
    model, tok = models.load(model_cfg, torch.device("cuda"))
    body = texts.paul_graham_essays(str(ROOT / "cache"))
    ids = torch.tensor(texts.token_ids(tok, body, args.length))[None].cuda()
    configs = _configs(args.configs)
    env = environment(torch.device("cuda"), args.git_rev)
    keep = ("device_name", "torch", "triton", "transformers", "git_revision", "time")
    args.out.mkdir(parents=True, exist_ok=True)
    for label, method, knobs in configs:
        table, wall = profile(model, ids, method, knobs, args.top)
        head = (
            f"{args.model} ({models.describe(model_cfg)}), L={args.length}, "
            f"yarn={model_cfg['yarn']}, {label}: one warm prefill, {wall:.1f} ms wall "
            "(profiler on)\n" + json.dumps({k: env.get(k) for k in keep})
        )
        path = args.out / f"profile_{args.model}_{args.length}_{label}.txt"
        path.write_text(head + "\n\n" + table + "\n")
        print(path.read_text())


if __name__ == "__main__":
    main()
