"""Step 1 on the GPU, per kernel: where the time goes (torch.profiler) for each sort grouping and
``kv_perm`` dtype. Writes ``step1_probe.json`` under ``--out``.

Shape B=1, Hq=32, Hkv=8, D=128, bf16, W=0, the structured synthetic input of ``bench_s2o.py``.
``--by-L 8192,...,131072``: the (L, S) table for both sort modes and both key-score paths, with
the host time per call next to the GPU median.
Usage (GPU machine): ``PYTHONPATH=. python3 benchmarks/step1_probe.py --rev <sha> --out DIR``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from collections import defaultdict

import torch
from triton.testing import do_bench

from benchmarks.bench_s2o import environment, structured_qkv
from s2o.kernels import s2o_step1

step1_mod = importlib.import_module("s2o.kernels.s2o_step1")  # the package re-exports the function

CONFIGS = [("chunks", torch.int64), ("chunks", torch.int32), ("full", torch.int64),
           ("cub", torch.int64), ("cub", torch.int32)]  # fmt: skip


def profile(fn, iters=3):
    """Mean GPU time per call of every kernel name (ms), the 12 largest."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    acc = defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if t:
            acc[ev.key[:80]] += t / 1e3 / iters
    return dict(sorted(acc.items(), key=lambda kv: -kv[1])[:12])


def host_ms(fn, calls=20):
    """Host time per call (ms): ``calls`` calls queued without synchronising in between. Where it
    comes close to the GPU median, the call is bound by the host (Python and launch overhead)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    return host


def by_length(lengths):
    """Step 1 at every (L, S) (int64 kv_perm), per sort mode and key-score path: GPU median and
    host time per call. The paper's table shape."""
    rows = []
    for L in lengths:
        q, k, _ = structured_qkv(1, 32, 8, L, 128)
        for scores, fused in (("default", None), ("cublas_fp32", False)):
            for mode in ("chunks", "cub"):
                for s in (512, 1024, 2048, 4096):
                    fn = lambda s=s, m=mode, q=q, k=k, f=fused: s2o_step1(  # noqa: E731
                        q, k, segment_len=s, sort_mode=m, fused_scores=f
                    )
                    row = {"L": L, "S": s, "sort_mode": mode, "scores": scores,
                           "ms": do_bench(fn, warmup=3, rep=30, return_mode="median"),
                           "host_ms": host_ms(fn)}  # fmt: skip
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default=None)
    ap.add_argument("--out", default="results/kernels/step1_probe")
    ap.add_argument("--L", type=int, default=131072)
    ap.add_argument("--by-L", default="", help="lengths for the (L, S) table, int64 kv_perm")
    ap.add_argument("--by-L-only", action="store_true", help="skip the rows at --L")
    args = ap.parse_args()
    B, Hq, Hkv, D, S = 1, 32, 8, 128, 2048
    q, k, _ = structured_qkv(B, Hq, Hkv, args.L, D)
    rec = {"env": environment(args.rev), "L": args.L, "S": S, "shape": [B, Hq, Hkv, D], "rows": []}
    if args.by_L_only:
        configs, segment_lens = [], ()
    else:
        configs, segment_lens = CONFIGS, (512, 1024, 2048, 4096)
    ref = s2o_step1(q, k, segment_len=S)[1]
    # key scores: the library default (the key-score kernel for bf16 K) and, for comparison, an
    # fp32 copy of K with cuBLAS fp32 GEMMs (the path before it); "differs" counts kv_perm
    # entries that differ from the default's (near-ties ranked by other roundings)
    for scores, fused in (("default", None), ("cublas_fp32", False)):
        for mode, dtype in configs:
            fn = lambda m=mode, d=dtype, f=fused: s2o_step1(  # noqa: E731
                q, k, segment_len=S, sort_mode=m, index_dtype=d, fused_scores=f
            )
            got = fn()[1].long()
            row = {"scores": scores, "sort_mode": mode, "index_dtype": str(dtype),
                   "ms": do_bench(fn, warmup=5, rep=50, return_mode="median"),
                   "kernels_ms": profile(fn), "equal": torch.equal(got, ref),
                   "differs": int((got != ref).sum())}  # fmt: skip
            print(json.dumps(row), flush=True)
            rec["rows"].append(row)
            torch.cuda.empty_cache()
    rec["by_S"] = {}  # Step 1 by segment length, per sort mode (int64 kv_perm)
    for s in segment_lens:
        for mode in ("chunks", "cub"):
            fn = lambda s=s, m=mode: s2o_step1(q, k, segment_len=s, sort_mode=m)  # noqa: E731
            rec["by_S"][f"{mode} S={s}"] = do_bench(fn, warmup=3, rep=30, return_mode="median")
            torch.cuda.empty_cache()
    print(json.dumps(rec["by_S"]), flush=True)
    rec["by_L"] = by_length([int(x) for x in args.by_L.split(",") if x])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "step1_probe.json"), "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
