"""Where a method starts to beat dense attention inside a model: one layer's call, per length.

For one head shape and dtype (B=1) and one method with its knobs, at every length: the dense call
(``s2o.hf.attend_dense``: transformers' SDPA route, causal, GQA as the model hands it) and the
sparse call (``s2o.hf.attend_sparse``: the method's estimation, then its sparse attention), the
two calls ``s2o.hf.sparse_prefill`` makes, on Q/K/V laid out as a transformers layer hands them
(``[B, H, L, D]`` views of ``[B, L, H, D]`` memory). ``do_bench`` medians (CUDA events; a host
bound call shows in them as idle GPU time); the estimation alone and the density are recorded too.

``metrics.crossover`` (:func:`s2o.crossover.crossover_length`): the smallest length from
which on the method is faster than dense by ``--margin``; ``None`` if it is not at the longest.
``sparse_prefill(..., min_len="auto")`` reads it (:func:`s2o.crossover.lookup`).

    python -m benchmarks.crossover --method s2o --heads 9/3 --head-dim 64 --rev <sha>   # GPU
    python -m benchmarks.crossover --smoke --out /tmp/bench   # CPU check: reference impl, tiny L

``--smoke`` runs on the CPU at a few tiny lengths with the methods' reference implementation; its
record says ``smoke: true`` and is never read as a crossover (tests/test_crossover.py runs it).
Unlike the kernel benchmarks this one needs transformers (the ``models`` extra): its dense call
is the model plug-in's.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

from s2o.crossover import BENCHMARK, DEFAULT_MARGIN, crossover_length  # noqa: E402
from s2o.hf import attend_dense, attend_sparse  # noqa: E402
from s2o.methods import METHODS, bind  # noqa: E402

LENGTHS = "1024,1536,2048,3072,4096,6144,8192,12288,16384,24576,32768,49152,65536,98304,131072"
SMOKE_LENGTHS = "64,96,160"
SMOKE_KNOBS = {"s2o": {"segment_len": 32, "block_m": 16, "block_n": 16}}


def as_layer_hands_them(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, L, D]`` with ``[B, L, H, D]`` memory, as a transformers layer's ``view`` +
    ``transpose`` (and RoPE, and the cache's first update) leave it."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def measure_length(method, q, k, v, bench) -> dict:
    """Dense and sparse call times (ms), the estimation alone and the density at one length."""
    hq, hkv, D = q.shape[1], k.shape[1], q.shape[-1]
    scale = D**-0.5
    layer = SimpleNamespace(num_key_value_groups=hq // hkv, is_causal=True)
    dense_ms = bench(lambda: attend_dense(layer, q, k, v, None, scaling=scale, dropout=0.0))
    sparse_ms = bench(lambda: attend_sparse(method, q, k, v, scale))
    estimate_ms = bench(lambda: method.estimate(q, k, v, scale=scale))
    *_, st, _ = attend_sparse(method, q, k, v, scale)
    return {"L": q.shape[2], "dense_ms": dense_ms, "sparse_ms": sparse_ms,
            "estimate_ms": estimate_ms, "speedup": dense_ms / sparse_ms,
            "density": float(st.density_per_head.float().mean())}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="s2o", choices=sorted(METHODS))
    ap.add_argument("--knobs", default="{}", help='the method\'s knobs as JSON, e.g. {"tau": 0.01}')
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--lengths", default=LENGTHS)
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                    help="the method must be this fraction faster than dense")  # fmt: skip
    common.add_common_args(ap, default_heads="32/8")
    args = ap.parse_args(argv)
    args.knobs = json.loads(args.knobs)
    if not isinstance(args.knobs, dict):
        raise SystemExit(f"--knobs must be a JSON object, got {args.knobs!r}")
    if args.smoke:
        args.lengths = SMOKE_LENGTHS
        args.knobs = {**SMOKE_KNOBS.get(args.method, {}), **args.knobs}
        if "impl" in METHODS[args.method].defaults:
            args.knobs["impl"] = "reference"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    shape = common.Shape.from_args(args)
    if not args.smoke:
        shape = common.Shape(shape.B, shape.Hq, shape.Hkv, shape.D, args.dtype, shape.device)
    method = bind(args.method, **args.knobs)
    lengths = sorted(int(x) for x in args.lengths.split(",") if x)
    knobs = {k: v for k, v in method.config.items() if k not in method.method.layer_knobs}
    config = {"method": args.method, "knobs": knobs, "lengths": lengths,
              "margin": args.margin, "input": args.input, "seed": args.seed, "causal": True,
              "layout": "BHLD view of BLHD", "smoke": args.smoke}  # fmt: skip
    rec = common.Recorder(BENCHMARK, config, common.command_line("benchmarks.crossover", argv),
                          shape, args.out, args.rev, metrics={"rows": []})  # fmt: skip
    bench = common.timer(shape, warmup_ms=25, rep_ms=100)
    method = method.per_layer()
    for L in lengths:
        common.free_memory()
        q, k, v = (as_layer_hands_them(x) for x in common.make_qkv(args.input, shape, L, args.seed))
        row = measure_length(method, q, k, v, bench)
        common.log(row)
        rec.metrics["rows"].append(row)
        rec.metrics["crossover"] = crossover_length(rec.metrics["rows"], args.margin)
        rec.save()
        del q, k, v
    common.log({"crossover": rec.metrics["crossover"], "margin": args.margin})
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
