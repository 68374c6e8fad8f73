"""GPU benchmark of the block-sparse baselines (FlexPrefill, XAttention, PBS, FlashPrefill).

Against Full (SDPA flash and cuDNN). Two parts, one record (:class:`benchmarks.common.Recorder`;
the tables come from ``analysis/``):

1. **Methods at their defaults** (``metrics.methods``; B=1, Hq=32, Hkv=8, D=128, bf16, causal,
   L = 4K..128K; FlashPrefill, whose alpha has no default, at ``--flashprefill-alpha``: 0.18, the
   official value of Llama-3.1-8B, whose shape this is, and what ``run.py`` takes without a
   model): estimation time, attention time, density (tiles / dense causal tiles, 128x128), MSE
   of the output against Full (SDPA flash) on the same input. Times are ``do_bench`` medians
   (CUDA events) after warm-up; the estimation is timed as ``method.estimate`` (mask and kernel
   index lists included), the attention as ``method.attend``.
2. **The shared block-sparse kernel at a fixed random density** (``metrics.kernel``) d = 5/10/25/50
   % at L = 128K: each (head, query block) keeps its diagonal block and every other causal block
   independently with the probability that gives density d; ratio = time / (measured density x
   SDPA-flash time). Target: ratio <= 1.3. A short sweep of (num_warps, num_stages) at d = 10 %
   is recorded too.

Input: :func:`benchmarks.common.make_qkv` (``eval/synthetic.py`` at its defaults, seed 0, the
same input as the harness's operator runs; ``--input calibrated``: the calibrated knobs).

Also recorded on a GPU (``metrics.extra``): a tile-size sweep of the fused XAttention estimator
and a breakdown of the FlexPrefill estimate (each step timed apart) at the kernel length.

    python -m benchmarks.bench_baselines --rev <sha>              # GPU
    python -m benchmarks.bench_baselines --smoke --out /tmp/bench  # CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import math
import time

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

import s2o  # noqa: E402
from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists  # noqa: E402
from s2o.kernels.launch import Launch  # noqa: E402
from s2o.methods.flashprefill import OFFICIAL_ALPHA  # noqa: E402
from s2o.methods.full import full_attention  # noqa: E402
from s2o.stats import dense_causal_tile_count  # noqa: E402

METHODS = ("flexprefill", "xattn", "pbs", "flashprefill")


def bench_methods(q, k, v, bench, impl, knobs):
    """Full and every method at its defaults on one input: rows of times, density, MSE."""
    L, device = q.shape[2], q.device.type
    backend = "flash" if device == "cuda" else "math"
    ref = full_attention(q, k, v, backend=backend)
    rows = [
        {
            "method": f"full_{backend}",
            "L": L,
            "time_estimate_ms": 0.0,
            "time_attention_ms": bench(lambda: full_attention(q, k, v, backend=backend)),
            "density": 1.0,
            "mse": 0.0,
        }
    ]
    if device == "cuda":
        try:
            t = bench(lambda: full_attention(q, k, v, backend="cudnn"))
            rows.append(dict(rows[0], method="full_cudnn", time_attention_ms=t))
        except RuntimeError as e:  # cuDNN SDPA not available for this build/shape
            print(f"cudnn SDPA skipped: {e}", flush=True)
    for name in METHODS:
        try:
            rows.append(bench_method(name, q, k, v, ref, L, bench, impl, knobs.get(name)))
        except Exception as e:  # record the failure, keep measuring the others
            rows.append({"method": name, "L": L, "error": repr(e)})
            print(json.dumps(rows[-1]), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_method(name, q, k, v, ref, L, bench, impl, knobs=None):
    """One method at its defaults (and ``knobs``): estimate / attend times, density, MSE vs
    ``ref``."""
    m = s2o.METHODS[name]
    knobs = {**m.defaults, **(knobs or {}), "impl": impl}
    t_est = bench(lambda m=m, knobs=knobs: m.estimate(q, k, v, **knobs))
    plan = m.estimate(q, k, v, **knobs)
    t_att = bench(lambda m=m, knobs=knobs, plan=plan: m.attend(q, k, v, plan, **knobs))
    out, stats = m.attend(q, k, v, plan, **knobs)
    mse = float(((out.float() - ref.float()) ** 2).mean())
    row = {
        "method": name,
        "L": L,
        "time_estimate_ms": t_est,
        "time_attention_ms": t_att,
        "density": stats.density,
        "mse": mse,
    }
    if name == "flexprefill" and "query_aware" in plan.extra:
        row["query_aware_heads"] = int(plan.extra["query_aware"].sum())
    print(json.dumps(row), flush=True)
    return row


def random_plan(B, H, nb, density, device, seed):
    """Diagonal + independent causal blocks with the probability that gives ``density``."""
    g = torch.Generator(device=device).manual_seed(seed)
    total = nb * (nb + 1) // 2
    p = max(0.0, (density * total - nb) / (total - nb))
    r = torch.arange(nb, device=device)
    mask = torch.rand(B, H, nb, nb, generator=g, device=device) < p
    mask = (mask & (r[None, :] < r[:, None])) | (r[None, :] == r[:, None])
    return mask


def bench_kernel(q, k, v, bench, t_flash, densities, configs):
    """The shared kernel at random densities (and launch configs at d = 10 %)."""
    B, Hq, L, _ = q.shape
    device = q.device.type
    bs = 128 if device == "cuda" else 16
    nb = math.ceil(L / bs)
    rows = []
    for d in densities:
        mask = random_plan(B, Hq, nb, d, device, seed=int(d * 1000))
        idx, cnt = mask_to_lists(mask)
        dens = float(mask.sum()) / (B * Hq * dense_causal_tile_count(L, bs, bs))
        for warps, stages in configs if d == 0.10 else [(None, None)]:

            def fn(warps=warps, stages=stages, idx=idx, cnt=cnt):
                return block_sparse_attention(
                    q, k, v, idx, cnt, block_size=bs, launch=Launch(warps, stages)
                )

            try:
                t = bench(fn)
            except Exception as e:  # e.g. a config that needs too much shared memory
                print(f"config warps={warps} stages={stages} failed: {e!r}"[:300], flush=True)
                continue
            row = {
                "L": L,
                "target_density": d,
                "density": dens,
                "time_ms": t,
                "sdpa_flash_ms": t_flash,
                "ratio_vs_density_x_flash": t / (dens * t_flash),
                "num_warps": warps,
                "num_stages": stages,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def extra_studies(q, k, bench):
    """XAttention estimator tile sweep + FlexPrefill estimate breakdown on one input."""
    from s2o.kernels.xattn_estimate import xattn_block_scores
    from s2o.methods import flexprefill as fp

    L = q.shape[2]
    out = {"L": L, "xattn_scores": [], "flexprefill_breakdown_ms": {}}
    for bm, bn in ((64, 64), (128, 64), (64, 128), (128, 128)):
        try:
            t = bench(
                lambda bm=bm, bn=bn: xattn_block_scores(
                    q, k, block_size=128, stride=16, scale=128**-0.5, block_m=bm, block_n=bn
                )
            )
        except Exception as e:
            t = repr(e)[:200]
        out["xattn_scores"].append({"block_m": bm, "block_n": bn, "ms": t})
        print(json.dumps(out["xattn_scores"][-1]), flush=True)
    bs, scale = 128, 128**-0.5
    b = out["flexprefill_breakdown_ms"]
    b["last_block_probs"] = bench(lambda: fp.last_block_probs(q, k, bs, scale))
    probs = fp.last_block_probs(q, k, bs, scale)
    b["vertical_slash"] = bench(lambda p=probs: fp.vertical_slash_scores(p))
    vert, sl = fp.vertical_slash_scores(probs)
    del probs
    nb = math.ceil(L / bs)
    b["budgets"] = bench(lambda: fp.budgets(vert, sl, gamma=0.9, min_blocks=8, max_blocks=nb))
    n_v, n_s = fp.budgets(vert, sl, gamma=0.9, min_blocks=8, max_blocks=nb)
    vb, sb = fp.sum_pool(vert, bs), fp.sum_pool(sl, bs)
    b["vertical_slash_mask"] = bench(lambda: fp.vertical_slash_mask(vb, sb, n_v, n_s))
    b["query_aware_mask_all_heads"] = bench(
        lambda: fp.query_aware_mask(q, k, block_size=bs, gamma=0.9, scale=scale)
    )
    mask = fp.vertical_slash_mask(vb, sb, n_v, n_s)
    b["mask_to_lists"] = bench(lambda: mask_to_lists(mask))
    print(json.dumps(b), flush=True)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,8192,16384,32768,65536,131072")
    ap.add_argument("--kernel-length", type=int, default=131072)
    ap.add_argument("--densities", default="0.05,0.10,0.25,0.50,1.0")
    ap.add_argument(
        "--flashprefill-alpha",
        type=float,
        default=OFFICIAL_ALPHA["llama"],
        help="FlashPrefill's alpha (no default; official per model family)",
    )
    common.add_common_args(ap)
    args = ap.parse_args(argv)
    args.impl, args.configs = "triton", [(None, None), (8, 2), (8, 4), (4, 3), (4, 2)]
    if args.smoke:  # the methods through the reference, the kernel under the interpreter
        args.lengths, args.kernel_length, args.impl = "2048", 96, "reference"
        args.configs = [(None, None), (4, 2)]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    shape = common.Shape.from_args(args)
    if args.smoke:
        shape = common.Shape(B=1, Hq=4, Hkv=2, D=32, dtype="float32", device="cpu")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    densities = [float(x) for x in args.densities.split(",")]
    config = {"lengths": lengths, "kernel_length": args.kernel_length, "densities": densities,
              "configs": args.configs, "impl": args.impl, "input": args.input, "seed": args.seed,
              "causal": True, "block": 128 if shape.device == "cuda" else 16,
              "knobs": {"flashprefill": {"alpha": args.flashprefill_alpha}},
              "smoke": args.smoke}  # fmt: skip
    command = common.command_line("benchmarks.bench_baselines", argv)
    rec = common.Recorder("bench_baselines", config, command, shape, args.out, args.rev,
                          metrics={"methods": [], "kernel": []})  # fmt: skip
    bench = common.timer(shape)
    t_flash_k, kept = None, None  # the kernel length's input is drawn once
    for L in lengths:
        t0 = time.perf_counter()
        common.free_memory()
        qkv = common.make_qkv(args.input, shape, L, args.seed)
        rows = bench_methods(*qkv, bench, args.impl, config["knobs"])
        print(f"L={L} done in {time.perf_counter() - t0:.1f} s", flush=True)
        rec.metrics["methods"] += rows
        rec.save()
        if L == args.kernel_length:
            t_flash_k, kept = rows[0]["time_attention_ms"], qkv
        del qkv
    common.free_memory()
    q, k, v = kept or common.make_qkv(args.input, shape, args.kernel_length, args.seed)
    del kept
    if t_flash_k is None:
        backend = "flash" if shape.device == "cuda" else "math"
        t_flash_k = bench(lambda: full_attention(q, k, v, backend=backend))
    rec.metrics["kernel"] = bench_kernel(q, k, v, bench, t_flash_k, densities, args.configs)
    rec.save()
    if shape.device == "cuda":
        rec.metrics["extra"] = extra_studies(q, k, bench)
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
