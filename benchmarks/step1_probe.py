"""Step 1 on the GPU: ``torch.sort`` ranking vs the Triton bucket ranking, per configuration, with a
per-kernel breakdown (torch.profiler). Writes ``step1_probe.json`` under ``--out``.

Shape B=1, Hq=32, Hkv=8, D=128, bf16, W=0, the structured synthetic input of ``bench_s2o.py``.
Usage (GPU machine): ``PYTHONPATH=. python3 benchmarks/step1_probe.py --rev <sha> --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch
from triton.testing import do_bench

from benchmarks.bench_s2o import environment, structured_qkv
from s2o.kernels import s2o_rank
from s2o.kernels.s2o_step1 import s2o_step1

CONFIGS = [  # (name, sort_mode, index dtype, RANK_CONFIG overrides)
    ("chunks_i64", "chunks", torch.int64, {}),
    ("bucket_i64", "bucket", torch.int64, {}),
    ("bucket_i32", "bucket", torch.int32, {}),
    ("bucket_cap2048", "bucket", torch.int64, {"cap": 2048}),
    ("bucket_cap8192", "bucket", torch.int64, {"cap": 8192, "samples_per_bucket": 64}),
    ("bucket_sortw4", "bucket", torch.int64, {"sort_warps": 4}),
    ("bucket_sortw16", "bucket", torch.int64, {"sort_warps": 16}),
    ("bucket_tile2048", "bucket", torch.int64, {"tile": 2048, "scatter_warps": 8}),
]


def run_config(q, k, S, mode, dtype, overrides):
    saved = dict(s2o_rank.RANK_CONFIG)
    s2o_rank.RANK_CONFIG.update(overrides)
    try:
        fn = lambda: s2o_step1(q, k, segment_len=S, sort_mode=mode, index_dtype=dtype)  # noqa: E731
        fn()
        ms = do_bench(fn, warmup=5, rep=40, return_mode="median")
        kernels = profile(fn)
    finally:
        s2o_rank.RANK_CONFIG.clear()
        s2o_rank.RANK_CONFIG.update(saved)
    return ms, kernels


def profile(fn, iters=3):
    """Mean GPU time per call of every kernel name (ms), largest first."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    acc = defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t:
            acc[ev.key[:90]] += t / 1e3 / iters
    return dict(sorted(acc.items(), key=lambda kv: -kv[1])[:14])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default=None)
    ap.add_argument("--out", default="results/kernels/step1_probe")
    ap.add_argument("--L", type=int, default=131072)
    ap.add_argument("--by-s", default="512,1024,2048,4096")
    args = ap.parse_args()
    B, Hq, Hkv, D, S = 1, 32, 8, 128, 2048
    q, k, _ = structured_qkv(B, Hq, Hkv, args.L, D)
    rec = {"env": environment(args.rev), "L": args.L, "S": S, "shape": [B, Hq, Hkv, D], "rows": []}
    ref = s2o_step1(q, k, segment_len=S, sort_mode="chunks")
    for name, mode, dtype, over in CONFIGS:
        ms, kernels = run_config(q, k, S, mode, dtype, over)
        saved = dict(s2o_rank.RANK_CONFIG)
        s2o_rank.RANK_CONFIG.update(over)
        got = s2o_step1(q, k, segment_len=S, sort_mode=mode, index_dtype=dtype)
        s2o_rank.RANK_CONFIG.clear()
        s2o_rank.RANK_CONFIG.update(saved)
        equal = torch.equal(got[0], ref[0]) and torch.equal(got[1].long(), ref[1])
        row = {"name": name, "ms": ms, "equal_to_torch_sort": equal, "config": over,
               "kernels_ms": kernels}  # fmt: skip
        print(json.dumps(row), flush=True)
        rec["rows"].append(row)
        del got
        torch.cuda.empty_cache()
    rec["by_S"] = {}
    for s in [int(x) for x in args.by_s.split(",") if x]:
        for mode in ("chunks", "bucket"):
            fn = lambda s=s, m=mode: s2o_step1(q, k, segment_len=s, sort_mode=m)  # noqa: E731
            rec["by_S"][f"{mode}_{s}"] = do_bench(fn, warmup=3, rep=30, return_mode="median")
            torch.cuda.empty_cache()
    print(json.dumps(rec["by_S"]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "step1_probe.json"), "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
