"""GPU benchmark of the S2O Triton kernels against SDPA flash (FA2) and SDPA cuDNN.

Shape: B=1, Hq=32, Hkv=8, D=128 by default (``--heads``, ``--head-dim``), bf16, causal,
L = 8K..128K; input :func:`benchmarks.common.make_qkv` (``--input``: the harness's synthetic
generator at its defaults or calibrated). For every L it times (``do_bench`` median) the harness's
Full with SDPA flash and cuDNN (:func:`s2o.methods.full.full_attention`), Step 1 at S =
512/1024/2048/4096, and the S2O kernels at S=2048, block 128x128: no skip (``tau <= 0``), the
early-stop kernel with ``tau <= 0`` (stop logic on, nothing skipped) and with ``tau > 0`` at the
density it reaches; ``--abcd`` adds the overhead decomposition of :mod:`benchmarks.abcd` (causal,
S=1024). Launch settings, the stop-check chunking and Step 1's options travel as arguments of
every call (:class:`Setup`), never as module state. Writes one record
(:class:`benchmarks.common.Recorder`, ``metrics.lengths``: one entry per L); the tables come from
``analysis/``.

    python -m benchmarks.bench_s2o --abcd --rev <sha>          # GPU
    python -m benchmarks.bench_s2o --smoke --abcd --out /tmp/bench
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

from benchmarks.abcd import abcd_times  # noqa: E402
from s2o.kernels import (  # noqa: E402
    STOP_CHUNK,
    Launch,
    s2o_fused,
    s2o_pass1,
    s2o_pass2,
    s2o_step1,
    step1_sort,  # noqa: E402
)
from s2o.kernels.launch import resolve_launch  # noqa: E402
from s2o.kernels.s2o_step1 import _segment_means  # noqa: E402
from s2o.methods.full import full_attention  # noqa: E402
from s2o.stats import dense_causal_tile_count, s2o_pass1_tile_count  # noqa: E402


@dataclass(frozen=True)
class Setup:
    """What every timed kernel call gets: segment length, square tiles, the launch settings per
    kernel (``{}``: the library's defaults), the stop-check chunking and Step 1's options."""

    S: int
    block: int = 128
    launch: dict = field(default_factory=dict)
    stop_chunk: tuple | None = None
    step1_kw: dict = field(default_factory=dict)

    @property
    def geo(self):
        return dict(segment_len=self.S, local_window=0, block_m=self.block, block_n=self.block)

    def pass1(self, q, k, v):
        return s2o_pass1(q, k, v, launch=self.launch.get("pass1"), **self.geo)

    def pass2(self, q, k, v, state, qp, kvp, **kw):
        return s2o_pass2(q, k, v, state, qp, kvp, launch=self.launch.get("pass2"),
                         stop_chunk=self.stop_chunk, **kw,
                         **self.geo)  # fmt: skip

    def fused(self, q, k, v, kvp, **kw):
        return s2o_fused(q, k, v, kvp, launch=self.launch.get("fused"),
                         stop_chunk=self.stop_chunk, **kw,
                         **self.geo)  # fmt: skip

    def step1(self, q, k, segment_len=None, **kw):
        return s2o_step1(q, k, segment_len=segment_len or self.S, **{**self.step1_kw, **kw})

    def resolved(self, D, device):
        """The settings each kernel ran with (the given fields, the defaults for the rest)."""
        out = {}
        for name in ("pass1", "pass2", "fused"):
            sub_n, kw = resolve_launch(name, self.launch.get(name), head_d=D, block_n=self.block,
                                       device=torch.device(device))  # fmt: skip
            out[name] = {**kw, "sub_n": sub_n}
        return out


def timer_for(shape: common.Shape, L: int):
    """A longer ``do_bench`` budget at long L, so the median is over several launches."""
    return common.timer(shape, warmup_ms=50, rep_ms=200 if L <= 16384 else 1500)


def causal_tflops(L, Hq, D, ms, density=1.0):
    return 4.0 * L * L / 2 * D * Hq * density / (ms * 1e-3) / 1e12


def full_times(q, k, v, bench) -> dict:
    """The harness's Full per SDPA backend (flash and cuDNN on a GPU, math on the CPU); a backend
    that refuses the shape is recorded as None with its error printed."""
    backends = ("flash", "cudnn") if q.is_cuda else ("math",)
    out = {}
    for name in backends:
        try:
            out[name] = bench(lambda name=name: full_attention(q, k, v, backend=name))
        except (RuntimeError, ValueError) as e:
            out[name] = None
            print(f"Full {name} failed: {e}", file=sys.stderr)
    return out


def s2o_times(q, k, v, perms, setup, taus, bench):
    """Kernel timings (Pass-1 + Pass-2, fused) and densities at several tau."""
    L, Hq, D = q.shape[2], q.shape[1], q.shape[3]
    qp, kvp = perms
    state = setup.pass1(q, k, v)
    rec = {"pass1_ms": bench(lambda: setup.pass1(q, k, v))}
    dense_tiles = dense_causal_tile_count(L, setup.block, setup.block)
    p1_tiles = s2o_pass1_tile_count(L, setup.S, 0, setup.block, setup.block)

    def two_pass(tau, early_stop=None, stop_tile="keep"):
        st = setup.pass1(q, k, v)
        return setup.pass2(q, k, v, st, qp, kvp, tau=tau, early_stop=early_stop,
                           stop_tile=stop_tile)  # fmt: skip

    rec["noskip_ms"] = bench(lambda: two_pass(0.0))
    rec["noskip_stoplogic_ms"] = bench(lambda: two_pass(0.0, early_stop=True))
    rec["noskip_stoplogic_discard_ms"] = bench(
        lambda: two_pass(0.0, early_stop=True, stop_tile="discard")
    )
    rec["pass2_noskip_ms"] = bench(lambda: setup.pass2(q, k, v, state, qp, kvp, tau=0.0))
    rec["fused_noskip_ms"] = bench(lambda: setup.fused(q, k, v, kvp, tau=0.0))

    def sparse_point(tau):
        _, visited = two_pass(tau)
        density = float((visited.double().sum(-1) + p1_tiles).mean()) / dense_tiles
        _, vf = setup.fused(q, k, v, kvp, tau=tau)
        density_f = float((vf.double().sum(-1) + p1_tiles).mean()) / dense_tiles
        return {
            "tau": tau, "density": density, "kernel_ms": bench(lambda: two_pass(tau)),
            "kernel_discard_ms": bench(lambda: two_pass(tau, stop_tile="discard")),
            "fused_density": density_f,
            "fused_ms": bench(lambda: setup.fused(q, k, v, kvp, tau=tau)),
        }  # fmt: skip

    rec["sparse"] = [sparse_point(tau) for tau in taus]
    rec["noskip_tflops"] = causal_tflops(L, Hq, D, rec["noskip_ms"])
    return rec


SWEEP = ((4, 0), (8, 0), (16, 0), (32, 0), (2, 1), (4, 2))


def sweep_variants(q, k, v, perms, setup, taus, bench, variants, key):
    """D (stop logic on, tau=0) and the sparse points of two-pass S2O per variant of ``setup``:
    ``variants`` is ``[(row fields, Setup)]``.
    Returns ``{"L", "noskip_ms", key: [rows]}``."""
    L = q.shape[2]
    qp, kvp = perms
    dense_tiles = dense_causal_tile_count(L, setup.block, setup.block)
    p1_tiles = s2o_pass1_tile_count(L, setup.S, 0, setup.block, setup.block)

    def two_pass(tau, early_stop=None, setup=setup):
        st = setup.pass1(q, k, v)
        return setup.pass2(q, k, v, st, qp, kvp, tau=tau, early_stop=early_stop)

    out = {"L": L, "noskip_ms": bench(lambda: two_pass(0.0)), key: []}
    for fields, variant in variants:
        row = {**fields, "stoplogic_ms": bench(lambda c=variant: two_pass(0.0, True, c)),
               "sparse": []}  # fmt: skip
        for tau in taus:
            _, visited = two_pass(tau, None, variant)
            density = float((visited.double().sum(-1) + p1_tiles).mean()) / dense_tiles
            row["sparse"].append(
                {
                    "tau": tau,
                    "density": density,
                    "kernel_ms": bench(lambda t=tau, c=variant: two_pass(t, None, c)),
                }
            )
        common.log(row)
        out[key].append(row)
    return out


def sweep_chunks(q, k, v, perms, setup, taus, bench, chunks=SWEEP):
    """Stop-check chunking vs speed: D (stop logic on, tau=0) and the sparse points, for (first
    chunk, growth per chunk) pairs."""
    variants = [({"chunk": c, "grow": g}, dataclasses.replace(setup, stop_chunk=(c, g)))
                for c, g in chunks]  # fmt: skip
    return sweep_variants(q, k, v, perms, setup, taus, bench, variants, "chunks")


def copy_bandwidth(shape: common.Shape) -> float | None:
    """Device-to-device copy of 2 GiB: (bytes read + written) / time, TB/s (the memory ceiling);
    None on the CPU."""
    if shape.device != "cuda":
        return None
    x = torch.empty(2**30, dtype=torch.int16, device="cuda").random_()
    y = torch.empty_like(x)
    ms = common.timer(shape, warmup_ms=20, rep_ms=200)(lambda: y.copy_(x))
    return 2 * 2**31 / (ms * 1e-3) / 1e12


def _sort_all(rects):
    return [torch.sort(r, dim=-1, descending=True, stable=True) for r in rects]


STEP1_VARIANTS = (("chunks", 4), ("chunks", 8), ("chunks", 16), ("full", None))


def step1_breakdown(q, k, S, bench):
    """Step 1 at one shape, per sort grouping (mode, number of chunks): the total, and the key
    scoring (fp32 products into the sort rectangles) and the sort of those rectangles timed
    apart; plus the total with an int32 kv_perm for the default grouping. Every number here is
    of the fp32-copy + cuBLAS scoring path (``"scores"`` in the record), so the parts add up to
    the totals. The groups come from :func:`s2o.kernels.step1_sort._sort_groups` with the
    variant's chunk count and no key floor (the library's total uses its own defaults)."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    n_seg = -(-L // S)
    prefix = [n * S for n in range(n_seg)]
    out = {"keys": B * Hq * sum(prefix), "scores": "cublas_fp32", "variants": []}
    q_mean = _segment_means(q, S).view(B, Hkv, Hq // Hkv, n_seg, D)
    kf = k.float()
    for mode, chunks in STEP1_VARIANTS:
        groups = step1_sort._sort_groups(prefix, B * Hq, mode, max_chunks=chunks, min_keys=1)

        def scores(groups=groups):
            res = []
            for a, b in groups:
                qm = q_mean[:, :, :, a:b].reshape(B, Hkv, -1, D)
                res.append(torch.matmul(qm, kf[:, :, : prefix[b - 1]].transpose(-1, -2)))
            return res

        rects = [r.view(B, Hq, b - a, -1) for r, (a, b) in zip(scores(), groups)]
        row = {"mode": mode, "chunks": chunks, "calls": len(groups),
               "sorted_keys": sum(r.numel() for r in rects),
               "total_ms": bench(lambda m=mode: s2o_step1(q, k, segment_len=S, sort_mode=m,
                                                          fused_scores=False)),
               "score_ms": bench(scores),
               "sort_ms": bench(lambda rects=rects: _sort_all(rects))}  # fmt: skip
        del rects
        out["variants"].append(row)
    out["total_default_int32_ms"] = bench(
        lambda: s2o_step1(q, k, segment_len=S, index_dtype=torch.int32, fused_scores=False)
    )
    return out


TUNE_CANDIDATES = {  # (num_warps, num_stages, sub_n) per head size
    64: ((4, 2, 128), (4, 3, 128), (8, 2, 128), (8, 3, 128), (4, 3, 64)),
    128: ((8, 2, 128), (8, 3, 128), (8, 5, 128), (4, 2, 128)),
    256: ((8, 2, 64), (8, 1, 128), (8, 2, 32), (8, 3, 32), (4, 2, 64), (8, 3, 64)),
}


def tune(q, k, v, perms, setup, bench):
    """Pick (num_warps, num_stages, sub_n) per kernel at this shape; every candidate's time and
    failure is printed and recorded. Returns ``(launch {kernel: Launch}, trials)``."""
    qp, kvp = perms
    D = q.shape[-1]
    state = setup.pass1(q, k, v)
    runs = {
        "pass1": lambda s: s.pass1(q, k, v),
        "pass2": lambda s: s.pass2(q, k, v, state, qp, kvp, tau=0.0),
        "fused": lambda s: s.fused(q, k, v, kvp, tau=0.0),
    }
    chosen, trials = {}, []
    for name, fn in runs.items():
        best = None
        for w, st, sub in TUNE_CANDIDATES.get(D, TUNE_CANDIDATES[128]):
            cfg = Launch(num_warps=w, num_stages=st, sub_n=min(sub, setup.block))
            trial = dataclasses.replace(setup, launch={**setup.launch, name: cfg})
            try:
                t = bench(lambda f=fn, s=trial: f(s))
            except Exception as e:  # out of shared memory etc.: recorded
                print(f"tune {name} {cfg}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                trials.append({"kernel": name, **vars(cfg), "error": type(e).__name__})
                continue
            common.log({"tune": name, **vars(cfg), "ms": t})
            trials.append({"kernel": name, **vars(cfg), "ms": t})
            if best is None or t < best[0]:
                best = (t, cfg)
        if best is not None:
            chosen[name] = best[1]
    return chosen, trials


def run_length(args, shape, setup, L, taus) -> dict:
    """Every timing for one sequence length."""
    common.free_memory()
    q, k, v = common.make_qkv(args.input, shape, L, args.seed)
    bench = timer_for(shape, L)
    step1 = {str(s): bench(lambda s=s: setup.step1(q, k, segment_len=s)) for s in args.step1_lens}
    perms = setup.step1(q, k)
    rec = {"L": L, "full_ms": full_times(q, k, v, bench), "step1_ms": step1,
           "s2o": s2o_times(q, k, v, perms, setup, taus, bench)}  # fmt: skip
    del perms
    if args.abcd:
        rec["abcd"] = abcd_times(q, k, v, segment_len=args.abcd_segment_len, bench=bench,
                                 block=setup.block, launch=setup.launch,
                                 step1_kw=setup.step1_kw)  # fmt: skip
    common.log(rec)
    return rec


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8192,16384,32768,65536,131072")
    ap.add_argument("--taus", default="0.002,0.005,0.02")
    ap.add_argument("--segment-len", type=int, default=2048)
    ap.add_argument("--block", type=int, default=128, help="block_m = block_n")
    ap.add_argument("--abcd", action="store_true", help="the causal ABCD decomposition per L")
    ap.add_argument("--sweep", default="", help="lengths for the stop-check chunk sweep")
    ap.add_argument(
        "--sweep-chunks",
        default="",
        help="(first chunk:growth) pairs of the sweep, e.g. 1:1,2:1 (default: SWEEP)",
    )
    ap.add_argument("--step1-breakdown", type=int, default=0, help="L for the Step-1 breakdown")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="pick (num_warps, num_stages, sub_n) per kernel at --tune-length and use "
        "them (default: the library's launch settings, what users get)",
    )
    ap.add_argument("--tune-length", type=int, default=16384, help="L of --tune")
    ap.add_argument(
        "--step1-sort",
        default=None,
        choices=("chunks", "full", "cub"),
        help="Step-1 sort for every measurement (default: the library's)",
    )
    ap.add_argument("--int32-kv-perm", action="store_true", help="Step 1 writes int32 kv_perm")
    common.add_common_args(ap)
    args = ap.parse_args(argv)  # fmt: skip
    args.step1_lens, args.abcd_segment_len = (512, 1024, 2048, 4096), 1024
    if args.smoke:  # 4 segments of 2 tiles; the sweep and the breakdown at the same length
        args.lengths, args.segment_len, args.block = "128", 32, 16
        args.step1_lens, args.abcd_segment_len, args.tune_length = (32, 64), 32, 128
        args.sweep_chunks = args.sweep_chunks or "1:0,1:1"
        args.sweep = "128" if args.sweep else ""
        args.step1_breakdown = 128 if args.step1_breakdown else 0
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    shape = common.Shape.from_args(args)
    step1_kw = {"sort_mode": args.step1_sort,
                "index_dtype": torch.int32 if args.int32_kv_perm else None}  # fmt: skip
    setup = Setup(S=args.segment_len, block=args.block,
                  step1_kw={k: v for k, v in step1_kw.items() if v is not None})  # fmt: skip
    taus = [float(t) for t in args.taus.split(",")]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    config = {"lengths": lengths, "taus": taus, "segment_len": setup.S, "block": setup.block,
              "local_window": 0, "causal": True, "input": args.input, "seed": args.seed,
              "abcd": args.abcd, "abcd_segment_len": args.abcd_segment_len,
              "step1_lens": list(args.step1_lens), "stop_chunk": list(STOP_CHUNK),
              "step1": {"sort_mode": args.step1_sort or step1_sort.SORT_MODE,
                        "index_dtype": str(step1_kw["index_dtype"] or step1_sort.INDEX_DTYPE)},
              "tune": args.tune, "smoke": args.smoke}  # fmt: skip
    command = common.command_line("benchmarks.bench_s2o", argv)
    rec = common.Recorder("bench_s2o", config, command, shape, args.out, args.rev,
                          metrics={"lengths": [], "sweep": []})  # fmt: skip
    m = rec.metrics
    m["copy_tb_s"] = copy_bandwidth(shape)
    if args.tune:
        q, k, v = common.make_qkv(args.input, shape, args.tune_length, args.seed)
        bench = timer_for(shape, args.tune_length)
        chosen, m["tune_trials"] = tune(q, k, v, setup.step1(q, k), setup, bench)
        setup = dataclasses.replace(setup, launch=chosen)
        del q, k, v
    m["launch"] = setup.resolved(shape.D, shape.device)
    if args.step1_breakdown:
        L = args.step1_breakdown
        q, k, _ = common.make_qkv(args.input, shape, L, args.seed)
        m["step1_breakdown"] = {
            "L": L,
            "S": setup.S,
            **step1_breakdown(q, k, setup.S, timer_for(shape, L)),
        }
        del q, k
    pairs = [tuple(int(x) for x in p.split(":")) for p in args.sweep_chunks.split(",") if p]
    for L in [int(x) for x in args.sweep.split(",") if x]:
        common.free_memory()
        q, k, v = common.make_qkv(args.input, shape, L, args.seed)
        m["sweep"].append(
            sweep_chunks(
                q, k, v, setup.step1(q, k), setup, taus, timer_for(shape, L), tuple(pairs) or SWEEP
            )
        )
        del q, k, v
        rec.save()
    for L in lengths:
        m["lengths"].append(run_length(args, shape, setup, L, taus))
        rec.save()  # after every length, so a cut-off run keeps what it measured
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
