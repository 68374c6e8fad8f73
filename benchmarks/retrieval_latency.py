"""Retrieval (Step 1) latency vs (L, S), with FlashAttention on the same input beside it (paper
Appendix, "Measured retrieval latency (ms) as a function of S and L").

For every L: SDPA flash (causal, the harness's Full: ``s2o.methods.full.full_attention``, GQA
native) and Step 1
(``s2o_step1``: segment means, query and key ranking, ``kv_perm`` written) at every S, per sort
mode (``chunks``: the library's default ``torch.sort`` path; ``cub``: the opt-in CUB radix sort,
which compiles a CUDA extension). The GPU median (``do_bench``) and the host time per call (calls
queued without synchronising: where it comes close to the median, Step 1 is bound by Python and
launches). Shape B=1, 32 query / 8 KV heads, D=128, bf16, causal, W=0, int64 ``kv_perm``; input
:func:`benchmarks.common.make_qkv`. The record's ``metrics.rows``: one row per (L, S, sort mode)
and ``metrics.flash``: one row per L.

    python -m benchmarks.retrieval_latency --rev <sha>            # GPU, 4K..128K
    python -m benchmarks.retrieval_latency --smoke --out /tmp/bench
"""

from __future__ import annotations

import argparse
import time

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

from s2o.kernels import s2o_step1  # noqa: E402
from s2o.methods.full import full_attention  # noqa: E402


def host_ms(fn, calls: int = 20) -> float | None:
    """Host time per call (ms) of ``calls`` calls queued without synchronising (CUDA only)."""
    if not torch.cuda.is_available():
        return None
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    return host


def measure_length(q, k, v, seg_lens, modes, rec: common.Recorder) -> None:
    """Flash and Step 1 at every (S, sort mode) for one input; rows appended to ``rec``."""
    L = q.shape[2]
    backend = "flash" if q.is_cuda else "math"
    bench = common.timer(rec.shape, warmup_ms=25, rep_ms=100 if L <= 32768 else 300)
    flash = {"L": L, "backend": backend,
             "ms": bench(lambda: full_attention(q, k, v, backend=backend))}  # fmt: skip
    common.log(flash)
    rec.metrics["flash"].append(flash)
    for mode in modes:
        for S in seg_lens:
            fn = lambda S=S, m=mode: s2o_step1(q, k, segment_len=S, sort_mode=m)  # noqa: E731
            row = {"L": L, "S": S, "sort_mode": mode, "ms": bench(fn), "host_ms": host_ms(fn)}
            common.log(row)
            rec.metrics["rows"].append(row)
        rec.save()


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,8192,16384,32768,65536,131072")
    ap.add_argument("--segment-lens", default="512,1024,2048,4096")
    ap.add_argument("--sort-modes", default="chunks,cub")
    common.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.smoke:  # cub needs CUDA
        args.lengths, args.segment_lens, args.sort_modes = "96,160", "32,64", "chunks"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    shape = common.Shape.from_args(args)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    seg_lens = [int(x) for x in args.segment_lens.split(",") if x]
    modes = [m for m in args.sort_modes.split(",") if m]
    config = {"lengths": lengths, "segment_lens": seg_lens, "sort_modes": modes,
              "input": args.input, "seed": args.seed, "causal": True, "local_window": 0,
              "index_dtype": "int64", "smoke": args.smoke}  # fmt: skip
    rec = common.Recorder("retrieval_latency", config,
                          common.command_line("benchmarks.retrieval_latency", argv), shape,
                          args.out, args.rev, metrics={"rows": [], "flash": []})  # fmt: skip
    for L in lengths:
        common.free_memory()
        q, k, v = common.make_qkv(args.input, shape, L, args.seed)
        measure_length(q, k, v, seg_lens, modes, rec)
        del q, k, v
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
