"""GPU benchmark of the block-sparse baselines (FlexPrefill, XAttention, PBS) against Full.

Two parts, one JSON record + one markdown table under ``--out`` (default ``results/baselines``):

1. **Methods at their defaults** (B=1, Hq=32, Hkv=8, D=128, bf16, causal, L = 8K..128K) on the
   structured synthetic input below: estimation time, attention time, density (tiles / dense causal
   tiles, 128x128), MSE of the output against Full (SDPA flash) on the same input. Times are
   ``triton.testing.do_bench`` medians (CUDA events) after warm-up; the estimation is timed as
   ``method.estimate`` (mask and kernel index lists included), the attention as ``method.attend``.
2. **The shared block-sparse kernel at a fixed random density** d = 5/10/25/50 % at L = 128K:
   each (head, query block) keeps its diagonal block and every other causal block independently
   with the probability that gives density d; ratio = time / (measured density x SDPA-flash time).
   Target: ratio <= 1.3. A short sweep of (num_warps, num_stages) at d = 10 % is recorded too.

Input: the project's structured synthetic generator (``eval/synthetic.py``, ``SyntheticSpec`` at
its defaults, seed 0: diffuse background 0.5, key mean 0.5, sink +12, 16 heavy hitters +5 x U[0.5,
1], one slash offset +4 plus a RoPE locality band, 2 % horizontal queries; the same input as the
harness's S2O operator runs), cast to bf16 on the GPU. ``--input simple`` uses the small generator
``structured_qkv`` below instead (sink +14, 32 heavy hitters +9, rotary local/slash +5).

Also recorded: a tile-size sweep of the fused XAttention estimator and a breakdown of the
FlexPrefill estimate (CUDA events around its steps) at the kernel length.

Run on the GPU machine (no install needed):
    PYTHONPATH=. python3 benchmarks/bench_baselines.py --out $OUT --rev <git sha>
``--smoke`` runs a tiny CPU version (interpreter) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--smoke" in sys.argv:  # Triton reads this when the kernels are decorated (import time)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import s2o  # noqa: E402
from experiments.provenance import git_revision
from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists  # noqa: E402
from s2o.kernels.launch import Launch  # noqa: E402
from s2o.methods.full import full_attention  # noqa: E402
from s2o.stats import dense_causal_tile_count  # noqa: E402

METHODS = ("flexprefill", "xattn", "pbs")


def structured_qkv(L, *, B=1, Hq=32, Hkv=8, D=128, seed=0, dtype=torch.bfloat16, device="cuda"):
    """The benchmark input (module docstring). Returns q ``[B,Hq,L,D]``, k, v ``[B,Hkv,L,D]``."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, device=device) * 0.4
    k = torch.randn(B, Hkv, L, D, generator=g, device=device) * 0.4
    v = torch.randn(B, Hkv, L, D, generator=g, device=device)
    root = math.sqrt(math.sqrt(D))  # q.k / sqrt(D) = a*b / sqrt(D): split the factor evenly
    nf = 8  # local + slash: rotary-style pairs on dims [0, 2*nf), periods 8 .. 1024
    pos = torch.arange(L, device=device, dtype=torch.float32)
    periods = 8.0 * 2.0 ** torch.arange(nf, device=device, dtype=torch.float32)
    ang = 2 * math.pi * pos[:, None] / periods[None, :]  # [L, nf]
    rot = torch.cat([ang.cos(), ang.sin()], dim=-1) * root * math.sqrt(5.0 / nf)
    q[..., : 2 * nf] = rot
    k[..., : 2 * nf] = rot
    # sink and heavy hitters along a per-KV-head unit direction in dims [2*nf, D)
    u = torch.randn(Hkv, D - 2 * nf, generator=g, device=device)
    u = torch.nn.functional.pad(u / u.norm(dim=-1, keepdim=True), (2 * nf, 0))
    G = Hq // Hkv
    q += 1.0 * root * u.repeat_interleave(G, 0)[None, :, None, :]
    k[:, :, 0] += 14.0 * root * u[None]
    for h in range(Hkv):
        heavy = torch.randperm(L - 1, generator=g, device=device)[:32] + 1
        k[:, h, heavy] += 9.0 * root * u[h]
    return q.to(dtype), k.to(dtype), v.to(dtype)


def project_qkv(L, *, B=1, Hq=32, Hkv=8, D=128, seed=0, dtype=torch.bfloat16, device="cuda"):
    """``eval/synthetic.py`` at its defaults (module docstring)."""
    from eval.synthetic import SyntheticSpec, synthetic_qkv

    spec = SyntheticSpec(L=L, batch=B, heads_q=Hq, heads_kv=Hkv, head_dim=D, seed=seed)
    return synthetic_qkv(spec, dtype=dtype, device=device)


INPUTS = {"project": project_qkv, "simple": None}  # "simple" filled below


INPUTS["simple"] = structured_qkv


def environment(rev: str) -> dict:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "git_rev": rev}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = "none (cpu smoke run)"
    return env


def timer(smoke: bool):
    if smoke:

        def run(fn):
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3

        return run
    from triton.testing import do_bench

    return lambda fn: do_bench(fn, warmup=25, rep=200, return_mode="median")


def bench_methods(L, shape, bench, impl, device):
    q, k, v = shape["make"](L, device=device, dtype=shape["dtype"], **shape["dims"])
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
            rows.append(bench_method(name, q, k, v, ref, L, bench, impl, device))
        except Exception as e:  # record the failure, keep measuring the others
            rows.append({"method": name, "L": L, "error": repr(e)})
            print(json.dumps(rows[-1]), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_method(name, q, k, v, ref, L, bench, impl, device):
    """One method at its defaults: estimate / attend times, density, MSE vs ``ref``."""
    m = s2o.METHODS[name]
    knobs = {**m.defaults, "impl": impl}
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


def bench_kernel(L, shape, bench, device, t_flash, densities, configs):
    dims = shape["dims"]
    B, Hq = dims["B"], dims["Hq"]
    q, k, v = shape["make"](L, device=device, dtype=shape["dtype"], **dims)
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


def cuda_ms(fn):
    """Mean of 3 timed calls after one warm-up, CUDA events (for the breakdown only)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 3


def extra_studies(L, shape, bench):
    """XAttention estimator tile sweep + FlexPrefill estimate breakdown at length ``L``."""
    from s2o.kernels.block_sparse import xattn_block_scores
    from s2o.methods import flexprefill as fp

    q, k, v = shape["make"](L, device="cuda", dtype=shape["dtype"], **shape["dims"])
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
    b["last_block_probs"] = cuda_ms(lambda: fp.last_block_probs(q, k, bs, scale))
    probs = fp.last_block_probs(q, k, bs, scale)
    b["vertical_slash"] = cuda_ms(lambda p=probs: fp.vertical_slash_scores(p))
    vert, sl = fp.vertical_slash_scores(probs)
    del probs
    nb = math.ceil(L / bs)
    b["budgets"] = cuda_ms(lambda: fp.budgets(vert, sl, gamma=0.9, min_blocks=8, max_blocks=nb))
    n_v, n_s = fp.budgets(vert, sl, gamma=0.9, min_blocks=8, max_blocks=nb)
    vb, sb = fp.sum_pool(vert, bs), fp.sum_pool(sl, bs)
    b["vertical_slash_mask"] = cuda_ms(lambda: fp.vertical_slash_mask(vb, sb, n_v, n_s))
    b["query_aware_mask_all_heads"] = cuda_ms(
        lambda: fp.query_aware_mask(q, k, block_size=bs, gamma=0.9, scale=scale)
    )
    mask = fp.vertical_slash_mask(vb, sb, n_v, n_s)
    b["mask_to_lists"] = cuda_ms(lambda: mask_to_lists(mask))
    print(json.dumps(b), flush=True)
    return out


def markdown(record) -> str:
    env = record["environment"]
    lines = [
        "# Block-sparse baselines: GPU benchmark",
        "",
        f"GPU: {env['gpu']}; torch {env['torch']}, triton {env['triton']}, "
        f"CUDA {env.get('cuda')}; git {env['git_rev']}.",
        f"Shapes: {record['shape']}. Command: `{record['command']}`.",
        f"Input: {record['input']}.",
        "",
        "## Methods at their defaults",
        "",
        "| L | method | estimate ms | attention ms | total ms | density | MSE vs Full |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in record["methods"]:
        if "error" in r:
            lines.append(f"| {r['L']} | {r['method']} | error: {r['error'][:80]} | | | | |")
            continue
        tot = r["time_estimate_ms"] + r["time_attention_ms"]
        lines.append(
            f"| {r['L']} | {r['method']} | {r['time_estimate_ms']:.2f} | "
            f"{r['time_attention_ms']:.2f} | {tot:.2f} | {r['density']:.4f} | {r['mse']:.3e} |"
        )
    lines += [
        "",
        "## Shared block-sparse kernel at random density (target ratio <= 1.3)",
        "",
        "| L | target d | measured d | kernel ms | SDPA flash ms | ratio t/(d*flash) "
        "| warps | stages |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["kernel"]:
        lines.append(
            f"| {r['L']} | {r['target_density']:.2f} | {r['density']:.4f} | {r['time_ms']:.2f} | "
            f"{r['sdpa_flash_ms']:.2f} | {r['ratio_vs_density_x_flash']:.3f} | "
            f"{r['num_warps'] or 'default'} | {r['num_stages'] or 'default'} |"
        )
    ex = record.get("extra")
    if ex:
        lines += ["", f"## Estimation details at L = {ex['L']}", ""]
        lines.append(
            "XAttention fused estimator (stride 16), tile sizes -> ms: "
            + ", ".join(
                f"{r['block_m']}x{r['block_n']}: {r['ms']:.2f}"
                if isinstance(r["ms"], float)
                else f"{r['block_m']}x{r['block_n']}: failed"
                for r in ex["xattn_scores"]
            )
        )
        lines.append("")
        lines.append(
            "FlexPrefill estimate breakdown (ms): "
            + ", ".join(f"{k} {v:.2f}" for k, v in ex["flexprefill_breakdown_ms"].items())
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="8192,16384,32768,65536,131072")
    ap.add_argument("--kernel-length", type=int, default=131072)
    ap.add_argument("--densities", default="0.05,0.10,0.25,0.50,1.0")
    ap.add_argument("--out", default="results/baselines")
    ap.add_argument("--rev", default=None, help="git revision (the GPU copy may have no .git)")
    ap.add_argument("--input", choices=sorted(INPUTS), default="project")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run to check the script")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        shape = {"dims": dict(B=1, Hq=4, Hkv=2, D=32), "dtype": torch.float32}
        lengths, klen, impl = [2048], 96, "reference"
        configs = [(None, None), (4, 2)]
    else:
        shape = {"dims": dict(B=1, Hq=32, Hkv=8, D=128), "dtype": torch.bfloat16}
        lengths, klen, impl = (
            [int(x) for x in args.lengths.split(",")],
            args.kernel_length,
            "triton",
        )
        configs = [(None, None), (8, 2), (8, 4), (4, 3), (4, 2)]
    make, cache = INPUTS[args.input], {}

    def make_cached(L, **kw):  # the kernel length is used by three parts: generate it once
        if L != klen:
            return make(L, **kw)
        if L not in cache:
            cache[L] = make(L, **kw)
        return cache[L]

    shape["make"] = make_cached
    densities = [float(x) for x in args.densities.split(",")]
    bench = timer(args.smoke)
    record = {
        "environment": environment(git_revision(args.rev)),
        "shape": {**shape["dims"], "dtype": str(shape["dtype"]), "causal": True, "block": 128},
        "input": (
            "eval/synthetic.py SyntheticSpec defaults, seed 0"
            if args.input == "project"
            else "benchmarks/bench_baselines.py structured_qkv, seed 0"
        ),
        "command": "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "methods": [],
        "kernel": [],
    }
    print(json.dumps(record["environment"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():
        (out / "bench_baselines.json").write_text(json.dumps(record, indent=1))
        (out / "bench_baselines.md").write_text(markdown(record))

    t_flash_k = None
    for L in lengths:
        t0 = time.perf_counter()
        rows = bench_methods(L, shape, bench, impl, device)
        print(f"L={L} done in {time.perf_counter() - t0:.1f} s", flush=True)
        record["methods"] += rows
        save()
        if L == klen:
            t_flash_k = rows[0]["time_attention_ms"]
    if t_flash_k is None:
        q, k, v = shape["make"](klen, device=device, dtype=shape["dtype"], **shape["dims"])
        backend = "flash" if device == "cuda" else "math"
        t_flash_k = bench(lambda: full_attention(q, k, v, backend=backend))
        del q, k, v
    record["kernel"] = bench_kernel(klen, shape, bench, device, t_flash_k, densities, configs)
    save()
    if device == "cuda":
        record["extra"] = extra_studies(klen, shape, bench)
        save()
    print(markdown(record))


if __name__ == "__main__":
    main()
