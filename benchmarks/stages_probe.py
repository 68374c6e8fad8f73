"""Probe: Pass-2 / fused launch settings (num_warps, num_stages) at 128K.

    PYTHONPATH=. python3 benchmarks/stages_probe.py [--L 131072] [--sparse]

B=1, Hq=32, Hkv=8, D=128, bf16, S=2048, block 128x128. Default: random inputs at tau=0 (every
tile computed, so the data does not change the work). ``--sparse``: bench_s2o's structured input
at tau = 0.002, 0.005, 0.02 (early stop). Prints one line per setting and checks that each setting
gives the same output as the default.
"""

import argparse

import torch
import triton.testing

from benchmarks.bench_s2o import structured_qkv
from s2o.kernels import Launch, s2o_step1
from s2o.kernels.s2o_attention import s2o_fused, s2o_pass1, s2o_pass2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=131072)
    ap.add_argument("--sparse", action="store_true")
    args = ap.parse_args()
    if args.sparse:
        return sparse(args.L)
    L, geo = args.L, dict(segment_len=2048, local_window=0, block_m=128, block_n=128)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 32, L, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, L, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 8, L, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    qp, kvp = s2o_step1(q, k, segment_len=2048)
    state = s2o_pass1(q, k, v, **geo)
    runs = {
        "pass2": lambda cfg=None: s2o_pass2(q, k, v, state, qp, kvp, tau=0.0, launch=cfg, **geo)[0],
        "fused": lambda cfg=None: s2o_fused(q, k, v, kvp, tau=0.0, launch=cfg, **geo)[0],
    }
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for name, run in runs.items():
        want = run()
        base = triton.testing.do_bench(run, warmup=100, rep=1000, return_mode="median")
        print(f"{name} default: {base:.2f} ms")
        for warps, stages in [(8, 2), (8, 4), (8, 5), (4, 4)]:
            cfg = Launch(warps, stages)
            fn = lambda run=run, cfg=cfg: run(cfg)  # noqa: E731
            try:
                got = fn()
                ms = triton.testing.do_bench(fn, warmup=100, rep=1000, return_mode="median")
            except Exception as err:  # out of shared memory and the like: report, go on
                print(f"{name} warps={warps} stages={stages}: failed ({type(err).__name__})")
                continue
            same = torch.equal(got, want)
            rel = ms / base
            print(f"{name} warps={warps} stages={stages}: {ms:.2f} ms ({rel:.3f}x) same={same}")


def sparse(L):
    """Pass-2 with early stop on the structured input: default launch vs 5 stages."""
    geo = dict(segment_len=2048, local_window=0, block_m=128, block_n=128)
    q, k, v = structured_qkv(1, 32, 8, L, 128)
    qp, kvp = s2o_step1(q, k, segment_len=2048)
    state = s2o_pass1(q, k, v, **geo)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for tau in (0.0, 0.002, 0.005, 0.02):
        times = {}
        for cfg in (None, (8, 5)):
            launch = Launch(*cfg) if cfg else None
            fn = lambda tau=tau, launch=launch: s2o_pass2(  # noqa: E731
                q, k, v, state, qp, kvp, tau=tau, launch=launch, **geo
            )
            out, visited = fn()
            times[cfg] = triton.testing.do_bench(fn, warmup=100, rep=1000, return_mode="median")
        density = float(visited.float().mean())
        ratio = times[(8, 5)] / times[None]
        print(f"tau={tau}: mean visited {density:.1f} tiles, default {times[None]:.2f} ms, "
              f"stages=5 {times[(8, 5)]:.2f} ms ({ratio:.3f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
