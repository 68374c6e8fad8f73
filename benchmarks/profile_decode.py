"""Where a model's greedy decode step spends its time, one prompt at a time and in batches: the
accuracy job's decode (:mod:`experiments.decode`), timed and profiled, in one benchmark record.

    python -m benchmarks.profile_decode --model gemma3_270m --model-path /data/g \\
        --gguf-file gemma-3-270m-q4_k_m.gguf --length 16384 --batches 1,8 --out results/benchmarks

For each batch size B of ``--batches``: B prompts of ``--length`` tokens (seeded random token
ids: the cost of a decode step does not depend on the text) are prefilled one at a time through
``s2o.hf.sparse_prefill`` with ``--method`` (default ``full``), as the accuracy job does, then
decoded together for ``--steps`` forwards with EOS off (every row runs the whole budget), after
one untimed warm-up of the same shape. Per B the record holds: the decode wall time per step and
per token (a step makes B tokens), tokens per second, and with ``--profile`` (the default) one
more run of the same shape under ``torch.profiler``: the ops with the most host (self CPU) time
and, on a GPU, the kernels with the most device time, the GPU's kernel time per step and the
share of the step's wall time it covers (``gpu_busy``: well under 1 means the host bounds the
step). ``--weights random`` takes the config's ``arch`` with random weights (no download; a CPU
check of the script).

Runs on a GPU (what it is for) or on the CPU; the record says which (``environment``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eval import models


def _batches(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--batches {text!r}: comma-separated positive ints") from None
    if not out or any(b < 1 for b in out):
        raise SystemExit(f"--batches {text!r}: comma-separated positive ints")
    return out


def _prompts(vocab: int, length: int, count: int, seed: int, device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    low = min(1000, vocab // 2)  # away from the special tokens at the start of most vocabularies
    return [torch.randint(low, vocab, (1, length), generator=g).to(device) for _ in range(count)]


def _decode(model, prompts, steps: int, sync) -> tuple[float, float]:
    """Prefill each prompt alone, decode them together for ``steps`` forwards: ``(prefill ms,
    decode wall ms)`` (the decode's wall time is the batch's: its rows' shares summed)."""
    from experiments.decode import greedy_decode_batch, prefill

    items = [prefill(model, ids, steps + 1, sync=sync) for ids in prompts]
    outs = greedy_decode_batch(model, items, sync=sync)
    if any(o.decode_steps != steps for o in outs):
        raise RuntimeError(f"a row stopped before {steps} steps: {[o.stopped for o in outs]}")
    return sum(o.prefill_ms for o in outs), sum(o.decode_ms for o in outs)


def _profile(model, prompts, steps: int, sync, top: int) -> dict:
    """One more run of the same shape under torch.profiler: top host ops and GPU kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from experiments.decode import greedy_decode_batch, prefill

    items = [prefill(model, ids, steps + 1, sync=sync) for ids in prompts]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        sync()
        t0 = time.perf_counter()
        greedy_decode_batch(model, items, sync=sync)
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    events = list(prof.key_averages())
    host = sorted((e for e in events if e.self_cpu_time_total > 0),
                  key=lambda e: e.self_cpu_time_total, reverse=True)  # fmt: skip
    kernels = [e for e in events if e.device_type == DeviceType.CUDA
               and e.self_device_time_total > 0 and e.key != "Command Buffer Full"]  # fmt: skip
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    row = lambda e, us: {"name": e.key[:120], "calls": e.count, "ms_per_step": us / 1e3 / steps}
    return {
        "wall_ms_per_step_profiled": wall_ms / steps,
        "top_host_ops": [row(e, e.self_cpu_time_total) for e in host[:top]],
        "top_gpu_kernels": [row(e, e.self_device_time_total) for e in kernels[:top]],
        "gpu_kernel_ms_per_step": gpu_ms / steps if kernels else None,
        "gpu_busy": gpu_ms / wall_ms if kernels else None,
    }


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a conf/model/*.yaml name")
    ap.add_argument("--model-path", help="a folder holding the GGUF (model.path)")
    ap.add_argument("--gguf-file", help="model.gguf_file, with --model-path")
    ap.add_argument("--weights", choices=["pretrained", "random"], default="pretrained")
    ap.add_argument("--yarn", action="store_true", help="model.yarn=true")
    ap.add_argument("--length", type=int, required=True, help="prompt tokens")
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=64, help="decode forwards per run")
    ap.add_argument("--method", default="full", help="the prefill's method (the decode is dense)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rev", default=None, help="the code revision (default: git)")
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = ap.parse_args(argv)
    batches = _batches(args.batches)
    if args.length < 1 or args.steps < 1:
        raise SystemExit(f"--length {args.length} and --steps {args.steps} must be >= 1")

    from benchmarks.common import command_line, model_config, record_head
    from experiments.records import benchmark_record_path, write_record
    from s2o.hf import sparse_prefill

    model_cfg = model_config(args.model, path=args.model_path, gguf_file=args.gguf_file,
                             yarn=args.yarn, weights=args.weights)  # fmt: skip
    context, where = models.context(model_cfg)
    if context is not None and args.length + args.steps + 1 > context:
        raise SystemExit(
            f"--length {args.length} + --steps > the {context}-token context ({where})"
        )
    device = torch.device(args.device)
    model, _ = models.load(model_cfg, device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    gc = model.generation_config
    eos, gc.eos_token_id = gc.eos_token_id, None  # every row runs the whole budget
    vocab = model.config.get_text_config(decoder=True).vocab_size
    rows = []
    try:
        with torch.inference_mode(), sparse_prefill(model, args.method):
            for b in batches:
                prompts = _prompts(vocab, args.length, b, seed=b, device=device)
                _decode(model, prompts, min(args.steps, 4), sync)  # warm-up
                prefill_ms, decode_ms = _decode(model, prompts, args.steps, sync)
                row = {
                    "batch": b, "length": args.length, "steps": args.steps,
                    "prefill_ms_per_prompt": prefill_ms / b,
                    "decode_ms_per_step": decode_ms / args.steps,
                    "decode_ms_per_token": decode_ms / (args.steps * b),
                    "tokens_per_s": 1e3 * args.steps * b / decode_ms,
                }  # fmt: skip
                if args.profile:
                    row.update(_profile(model, prompts, args.steps, sync, args.top))
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.startswith("top_")}),
                      flush=True)  # fmt: skip
    finally:
        gc.eos_token_id = eos
    one = next((r for r in rows if r["batch"] == 1), None)
    for r in rows:  # tokens per second against one prompt at a time
        r["speedup_vs_batch1"] = r["tokens_per_s"] / one["tokens_per_s"] if one else None
    config = {"model": args.model, "weights": args.weights, "model_describe":
              models.describe(model_cfg), "yarn": model_cfg["yarn"], "length": args.length,
              "batches": batches, "steps": args.steps, "method": args.method,
              "dtype": str(next(model.parameters()).dtype)}  # fmt: skip
    command = command_line("benchmarks.profile_decode", argv)
    head = record_head("profile_decode", config, command, device, args.rev)
    path = benchmark_record_path(args.out, "profile_decode", head["id"])
    write_record(path, {"status": "ok", **head, "metrics": {"rows": rows}})
    print(f"record: {path}")
    return path


if __name__ == "__main__":
    main()
