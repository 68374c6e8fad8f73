"""Where S2O's time goes, kernel by kernel, on one input: the probe behind the kernel breakdown.

On one Q/K/V (``benchmarks.common.make_qkv``, B=1, bf16, causal, S=2048, 128x128 tiles) it times
SDPA flash and cuDNN, Step 1 (per sort mode, and per CUDA kernel through ``torch.profiler``),
Pass-1, Pass-2 at every ``--taus`` (tau=0 with and without the stop-rule control flow): the Triton
walk under the library's launch settings and every ``--variants`` setting, and the Gluon walk
(:mod:`s2o.kernels.gluon_walk`, Hopper; ``--gluon-stages``: its other ring sizes), and the fused
kernel. One row per
measurement in ``metrics.rows`` (``do_bench`` medians), with the density reached and the
walked tiles, so ``analysis/kernel_breakdown.py`` turns them into TFLOP/s. ``--once`` runs every
kernel once, untimed: the command Nsight Compute profiles (its CSV, saved beside the record as
``ncu.csv``, gives the page its bound verdicts; SchedulerStats gives the warps per scheduler
that ``analysis/kernel_breakdown.py`` reads, ``-k regex:_s2o_`` keeps ncu off the input's
generation).

    python -m benchmarks.kernel_probe --length 131072 --heads 32/8 --rev <sha>          # GPU
    ncu --csv --page details -k regex:_s2o_ --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section SchedulerStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis \
        python -m benchmarks.kernel_probe --once --parts pass1,pass2,pass2_gluon,fused > ncu.csv
    python -m benchmarks.kernel_probe --smoke --out /tmp/bench                           # CPU check
"""

from __future__ import annotations

import argparse
import time

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

from s2o.kernels import (  # noqa: E402
    WALK_INDEX_DTYPE,
    Launch,
    s2o_fused,
    s2o_pass1,
    s2o_pass2,
    s2o_step1,
)
from s2o.methods.full import full_attention  # noqa: E402
from s2o.stats import dense_causal_tile_count, s2o_pass1_tile_count  # noqa: E402

PARTS = ("full", "step1", "pass1", "pass2", "pass2_gluon", "fused", "profile")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--segment-len", type=int, default=2048)
    ap.add_argument("--variants", default="", help="Pass-2 launch settings warps:stages:sub_n,...")
    ap.add_argument("--gluon-stages", default="", help="Gluon walk ring sizes besides its default")
    ap.add_argument("--taus", default="0,0.005,0.02")
    ap.add_argument("--step1-sorts", default="chunks,full",
                    help="Step 1's sort modes to time; cub16, cub24: cub with score_bits 16, 24 "
                         "(and the share of kv_perm that differs, Pass-2 walks)")  # fmt: skip
    ap.add_argument("--rep-ms", type=float, default=800.0, help="do_bench budget per timing")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--once", action="store_true", help="each kernel once, untimed (for ncu)")
    common.add_common_args(ap)
    args = ap.parse_args(argv)
    args.parts = set(args.parts.split(","))
    args.step1_sorts = [_sort_spec(x) for x in args.step1_sorts.split(",") if x]
    if not args.parts <= set(PARTS):
        raise SystemExit(f"--parts: unknown {sorted(args.parts - set(PARTS))} (known: {PARTS})")
    args.block = 128
    if args.smoke:  # 4 segments of 2 tiles, fp32 on the CPU interpreter
        args.length, args.segment_len, args.block = 128, 32, 16
        args.parts -= {"full", "profile", "pass2_gluon"}  # Gluon has no interpreter
    return args


def _sort_spec(text: str) -> tuple[str, int]:
    """``chunks`` -> ``("chunks", 32)``, ``cub16`` -> ``("cub", 16)``; a bad value names itself."""
    mode, bits = text.rstrip("0123456789"), text[len(text.rstrip("0123456789")) :]
    if mode not in ("chunks", "full", "cub") or (bits and (mode != "cub" or int(bits) >= 32)):
        raise SystemExit(f"--step1-sorts: unknown {text!r} (chunks, full, cub, cub16, cub24)")
    return mode, int(bits or 32)


def score_bits_rows(q, k, v, perms, state, a, geo, emit):
    """Each ``--step1-sorts`` entry with ``score_bits < 32``: the share of ``kv_perm`` entries
    that differ from the exact ranking's, then Pass-2 (the default walk) at every tau on its
    perms beside the exact perms': walked tiles and the largest output difference."""
    for mode, bits in a.step1_sorts:
        if bits == 32:
            continue
        alt = s2o_step1(q, k, segment_len=a.segment_len, sort_mode=mode, score_bits=bits,
                        index_dtype=WALK_INDEX_DTYPE)  # fmt: skip
        ranked = perms[1] >= 0
        differs = float(((alt[1] != perms[1]) & ranked).double().sum() / ranked.double().sum())
        emit(part="step1_score_bits", sort=mode, score_bits=bits, kv_perm_differs=differs)
        for tau in (float(t) for t in a.taus.split(",")):
            kw = dict(tau=tau, early_stop=True, **geo)
            out, vis = s2o_pass2(q, k, v, state, *perms, **kw)
            alt_out, alt_vis = s2o_pass2(q, k, v, state, *alt, **kw)
            emit(part="pass2_score_bits", sort=mode, score_bits=bits, tau=tau,
                 walked_tiles=float(alt_vis.double().sum()),
                 walked_tiles_exact=float(vis.double().sum()),
                 max_abs_diff=float((alt_out.float() - out.float()).abs().max()))  # fmt: skip


def step1_profile(q, k, S: int) -> list[dict]:
    """Step 1's CUDA kernels: device milliseconds per Step-1 call and launches per call."""
    from torch.profiler import ProfilerActivity, profile

    calls = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            s2o_step1(q, k, segment_len=S, index_dtype=WALK_INDEX_DTYPE)
        torch.cuda.synchronize()
    rows = [{"kernel": e.key, "ms": e.device_time_total / 1e3 / calls, "launches": e.count / calls}
            for e in prof.key_averages() if e.device_time_total > 0]  # fmt: skip
    return sorted(rows, key=lambda r: -r["ms"])


def pass2_rows(q, k, v, perms, state, a, geo, bench, emit):
    """Pass-2 per launch setting and tau (tau=0: plain walk and stop-rule control flow), the
    Triton walk (part ``pass2``); then the Gluon walk at its default ring (part ``pass2_gluon``,
    where it takes the call: :mod:`s2o.kernels.gluon_walk`)."""
    L, hq = q.shape[2], q.shape[1]
    dense_tiles = dense_causal_tile_count(L, a.block, a.block)
    p1_tiles = s2o_pass1_tile_count(L, a.segment_len, 0, a.block, a.block)
    variants = []
    if "pass2" in a.parts:
        variants = [("pass2", "default", Launch(walk="triton"))] + [
            ("pass2", s, Launch(*(int(x) for x in s.split(":")), walk="triton"))
            for s in a.variants.split(",")
            if s
        ]
    if "pass2_gluon" in a.parts:
        variants.append(("pass2_gluon", "default", Launch(walk="gluon")))
        variants += [
            ("pass2_gluon", f"stages={n}", Launch(num_stages=int(n), walk="gluon"))
            for n in a.gluon_stages.split(",")
            if n
        ]
    for part, name, lv in variants:
        for tau in (float(t) for t in a.taus.split(",")):
            for stop in [False, True] if tau <= 0 else [True]:
                kw = dict(tau=tau, early_stop=stop, launch=lv, **geo)
                try:
                    _, vis = s2o_pass2(q, k, v, state, *perms, **kw)
                    ms = bench(lambda kw=kw: s2o_pass2(q, k, v, state, *perms, **kw))
                except Exception as e:  # out of shared memory etc.: recorded, the rest goes on
                    emit(part=part, launch=name, tau=tau, error=f"{type(e).__name__}: {e}"[:300])
                    continue
                walked = float(vis.double().sum())
                emit(
                    part=part,
                    launch=name,
                    tau=tau,
                    stop_logic=stop,
                    ms=ms,
                    walked_tiles=walked,
                    density=(walked / hq + p1_tiles) / dense_tiles,
                )


def main(argv=None) -> dict:
    a = parse_args(argv)
    shape = common.Shape.from_args(a)
    config = {"length": a.length, "segment_len": a.segment_len, "block": a.block,
              "variants": a.variants, "gluon_stages": a.gluon_stages, "taus": a.taus,
              "step1_sorts": [f"{m}{b if b < 32 else ''}" for m, b in a.step1_sorts],
              "parts": sorted(a.parts), "once": a.once,
              "input": a.input, "seed": a.seed, "index_dtype": str(WALK_INDEX_DTYPE),
              "smoke": a.smoke}  # fmt: skip
    rec = common.Recorder(
        "kernel_probe",
        config,
        common.command_line("benchmarks.kernel_probe", argv),
        shape,
        a.out,
        a.rev,
        metrics={"rows": []},
    )
    rows = rec.metrics["rows"]

    def emit(**row):
        rows.append(row)
        common.log(row)

    t0 = time.perf_counter()
    q, k, v = common.make_qkv(a.input, shape, a.length, a.seed)
    emit(part="input", seconds=round(time.perf_counter() - t0, 1))
    bench = common.timer(shape, warmup_ms=50, rep_ms=a.rep_ms)
    if a.once:

        def bench(fn):
            fn()
            if q.is_cuda:
                torch.cuda.synchronize()
            return None

    S = a.segment_len
    geo = dict(segment_len=S, local_window=0, block_m=a.block, block_n=a.block)
    if "full" in a.parts:
        for backend in ("flash", "cudnn"):
            emit(
                part="full",
                backend=backend,
                ms=bench(lambda b=backend: full_attention(q, k, v, backend=b)),
            )
    perms = s2o_step1(q, k, segment_len=S, index_dtype=WALK_INDEX_DTYPE)
    if "step1" in a.parts:
        for mode, bits in a.step1_sorts:
            ms = bench(
                lambda m=mode, b=bits: s2o_step1(
                    q, k, segment_len=S, sort_mode=m, score_bits=b, index_dtype=WALK_INDEX_DTYPE
                )
            )
            emit(part="step1", sort=mode, **({"score_bits": bits} if bits < 32 else {}), ms=ms)
    if "profile" in a.parts and not a.once:
        emit(part="step1_kernels", kernels=step1_profile(q, k, S))
    state = s2o_pass1(q, k, v, **geo)
    if "pass1" in a.parts:
        emit(part="pass1", ms=bench(lambda: s2o_pass1(q, k, v, **geo)))
    if a.parts & {"pass2", "pass2_gluon"}:
        pass2_rows(q, k, v, perms, state, a, geo, bench, emit)
    if "step1" in a.parts and not a.once:
        score_bits_rows(q, k, v, perms, state, a, geo, emit)
    if "fused" in a.parts:
        for tau in (float(t) for t in a.taus.split(",")):
            _, vis = s2o_fused(q, k, v, perms[1], tau=tau, **geo)
            emit(
                part="fused",
                tau=tau,
                walked_tiles=float(vis.double().sum()),
                ms=bench(lambda t=tau: s2o_fused(q, k, v, perms[1], tau=t, **geo)),
            )
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
