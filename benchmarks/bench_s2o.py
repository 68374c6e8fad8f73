"""GPU benchmark of the S2O Triton kernels against SDPA flash (FA2) and SDPA cuDNN.

Shape: B=1, Hq=32, Hkv=8, D=128 by default (``--heads``, ``--head-dim``), bf16, causal,
L = 8K..128K. For every L it times (median of
``triton.testing.do_bench``) SDPA flash, SDPA cuDNN, Step 1 at S = 512/1024/2048/4096, and the S2O
kernels at S=2048, block 128x128: no skip (``tau <= 0``), the early-stop kernel with ``tau <= 0``
(stop logic on, nothing skipped) and with ``tau > 0`` at the density it reaches; ``--abcd`` adds
the overhead decomposition of benchmarks/abcd.py. Writes ``results/kernels/bench_<gpu>.json``
and ``.md`` (or under ``--out``). Launch settings, the stop-check chunking and Step 1's options
travel as arguments of every call (:class:`Setup`), never as module state.

Input (density needs structure; Gaussian Q/K attends uniformly and never stops early):
:func:`structured_qkv`, drawn on the GPU from one seeded generator:
  * background: Gaussian q, k (logit std ~1);
  * RoPE-like locality: q and k of a KV head share a content vector ``c`` rotated by position with
    RoPE frequencies, so ``q_i . k_j`` has a term that peaks at ``i = j`` (diagonal band);
  * attention sink: every query of a KV head carries a unit direction ``u`` (removed from the
    Gaussian background of q and k), key 0 carries it too: ``+SINK`` logits in column 0 for
    every row;
  * heavy hitters: ``N_HEAVY`` random keys carry ``u`` at ``HEAVY`` logits (vertical stripes).
Values are Gaussian.

Run on the GPU machine: ``PYTHONPATH=. python3 benchmarks/bench_s2o.py --abcd --rev <git sha>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from experiments.provenance import git_revision
from s2o.kernels import STOP_CHUNK, Launch, s2o_fused, s2o_pass1, s2o_pass2, s2o_step1
from s2o.kernels.launch import resolve_launch
from s2o.stats import dense_causal_tile_count, s2o_pass1_tile_count

step1_mod = importlib.import_module("s2o.kernels.s2o_step1")  # the package re-exports the function

SINK, HEAVY, N_HEAVY, LOCAL, BACKGROUND, Q_SINK = 12.0, 8.0, 16, 4.0, 1.0, 3.0
SEED = 0


def structured_qkv(B, Hq, Hkv, L, D, *, seed=SEED, dtype=torch.bfloat16, device="cuda"):
    """Seeded synthetic post-RoPE Q/K/V with a sink, heavy hitters and a local band (see above)."""
    g = torch.Generator(device=device).manual_seed(seed)
    group = Hq // Hkv
    rnd = lambda *s: torch.randn(*s, generator=g, device=device)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)
    root = D**0.25  # q.k / sqrt(D) = a * b when q carries a*root*u and k carries b*root*u
    q = rnd(B, Hq, L, D) * BACKGROUND**0.5
    k = rnd(B, Hkv, L, D) * BACKGROUND**0.5
    theta = 10000.0 ** (-torch.arange(0, D, 2, device=device).float() / D)
    ang = torch.arange(L, device=device).float()[:, None] * theta[None, :]
    cos, sin = ang.cos(), ang.sin()

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    c = unit(rnd(B, Hkv, 1, D)) * root * LOCAL**0.5
    k = k + rope(c.expand(B, Hkv, L, D))
    q = q + rope(c.repeat_interleave(group, 1).expand(B, Hq, L, D))
    u = unit(rnd(B, Hkv, 1, D))  # the sink direction, removed from the Gaussian background
    k = k - (k * u).sum(-1, keepdim=True) * u
    uq = u.repeat_interleave(group, 1)
    q = q - (q * uq).sum(-1, keepdim=True) * uq + Q_SINK * root * uq
    k[:, :, 0] += SINK / Q_SINK * root * u[:, :, 0]
    heavy = torch.randint(1, L, (N_HEAVY,), generator=g, device=device)
    k[:, :, heavy] += HEAVY / Q_SINK * root * u
    v = rnd(B, Hkv, L, D)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@dataclass(frozen=True)
class Setup:
    """What every timed kernel call gets: segment length, tiles 128 x 128, the launch settings per
    kernel (``{}``: the library's defaults), the stop-check chunking and Step 1's options."""

    S: int
    launch: dict = field(default_factory=dict)
    stop_chunk: tuple | None = None
    step1_kw: dict = field(default_factory=dict)

    @property
    def geo(self):
        return dict(segment_len=self.S, local_window=0, block_m=128, block_n=128)

    def pass1(self, q, k, v):
        return s2o_pass1(q, k, v, launch=self.launch.get("pass1"), **self.geo)

    def pass2(self, q, k, v, state, qp, kvp, **kw):
        return s2o_pass2(q, k, v, state, qp, kvp, launch=self.launch.get("pass2"),
                         stop_chunk=self.stop_chunk, **kw, **self.geo)  # fmt: skip

    def fused(self, q, k, v, kvp, **kw):
        return s2o_fused(q, k, v, kvp, launch=self.launch.get("fused"),
                         stop_chunk=self.stop_chunk, **kw, **self.geo)  # fmt: skip

    def step1(self, q, k, segment_len=None, **kw):
        return s2o_step1(q, k, segment_len=segment_len or self.S, **{**self.step1_kw, **kw})

    def resolved(self, D):
        """The settings each kernel ran with (the given fields, the defaults for the rest)."""
        out = {}
        for name in ("pass1", "pass2", "fused"):
            sub_n, kw = resolve_launch(name, self.launch.get(name), head_d=D, block_n=128,
                                       device=torch.device("cuda"))  # fmt: skip
            out[name] = {**kw, "sub_n": sub_n}
        return out


def bench(fn, length):
    """Median ms; a longer budget at long L so the median is over several launches."""
    rep = 200 if length <= 16384 else 1500
    return do_bench(fn, warmup=50, rep=rep, return_mode="median")


def causal_tflops(L, Hq, D, ms, density=1.0):
    return 4.0 * L * L / 2 * D * Hq * density / (ms * 1e-3) / 1e12


def sdpa_times(q, k, v):
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = {}
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ):

        def run(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=True)

        try:
            out[name] = bench(run, q.shape[2])
        except RuntimeError as e:  # a backend that refuses the shape is recorded, not hidden
            out[name] = None
            print(f"SDPA {name} failed: {e}", file=sys.stderr)
    return out, kr, vr


def s2o_times(q, k, v, perms, setup, taus):
    """Kernel timings (Pass-1 + Pass-2, fused) and densities at several tau."""
    L, Hq, D = q.shape[2], q.shape[1], q.shape[3]
    S = setup.S
    qp, kvp = perms
    state = setup.pass1(q, k, v)
    rec = {"pass1_ms": bench(lambda: setup.pass1(q, k, v), L)}
    dense_tiles = dense_causal_tile_count(L, 128, 128)
    p1_tiles = s2o_pass1_tile_count(L, S, 0, 128, 128)

    def two_pass(tau, early_stop=None, stop_tile="keep"):
        st = setup.pass1(q, k, v)
        return setup.pass2(q, k, v, st, qp, kvp, tau=tau, early_stop=early_stop,
                           stop_tile=stop_tile)  # fmt: skip

    rec["noskip_ms"] = bench(lambda: two_pass(0.0), L)
    rec["noskip_stoplogic_ms"] = bench(lambda: two_pass(0.0, early_stop=True), L)
    rec["noskip_stoplogic_discard_ms"] = bench(
        lambda: two_pass(0.0, early_stop=True, stop_tile="discard"), L
    )
    rec["pass2_noskip_ms"] = bench(lambda: setup.pass2(q, k, v, state, qp, kvp, tau=0.0), L)
    rec["fused_noskip_ms"] = bench(lambda: setup.fused(q, k, v, kvp, tau=0.0), L)

    def sparse_point(tau):
        _, visited = two_pass(tau)
        density = float((visited.double().sum(-1) + p1_tiles).mean()) / dense_tiles
        _, vf = setup.fused(q, k, v, kvp, tau=tau)
        density_f = float((vf.double().sum(-1) + p1_tiles).mean()) / dense_tiles
        return {
            "tau": tau, "density": density, "kernel_ms": bench(lambda: two_pass(tau), L),
            "kernel_discard_ms": bench(lambda: two_pass(tau, stop_tile="discard"), L),
            "fused_density": density_f,
            "fused_ms": bench(lambda: setup.fused(q, k, v, kvp, tau=tau), L),
        }  # fmt: skip

    rec["sparse"] = [sparse_point(tau) for tau in taus]
    rec["noskip_tflops"] = causal_tflops(L, Hq, D, rec["noskip_ms"])
    return rec


SWEEP = ((4, 0), (8, 0), (16, 0), (32, 0), (2, 1), (4, 2))


def sweep_chunks(q, k, v, perms, setup, taus, chunks=SWEEP):
    """Stop-check chunking vs speed: D (stop logic on, tau=0) and the sparse points, for (first
    chunk, growth per chunk) pairs."""
    L = q.shape[2]
    qp, kvp = perms
    dense_tiles = dense_causal_tile_count(L, 128, 128)
    p1_tiles = s2o_pass1_tile_count(L, setup.S, 0, 128, 128)

    def two_pass(tau, early_stop=None, setup=setup):
        st = setup.pass1(q, k, v)
        return setup.pass2(q, k, v, st, qp, kvp, tau=tau, early_stop=early_stop)

    out = {"L": L, "noskip_ms": bench(lambda: two_pass(0.0), L), "chunks": []}
    for chunk, grow in chunks:
        chunked = dataclasses.replace(setup, stop_chunk=(chunk, grow))
        row = {
            "chunk": chunk,
            "grow": grow,
            "stoplogic_ms": bench(lambda c=chunked: two_pass(0.0, True, c), L),
            "sparse": [],
        }
        for tau in taus:
            _, visited = two_pass(tau, None, chunked)
            density = float((visited.double().sum(-1) + p1_tiles).mean()) / dense_tiles
            row["sparse"].append({"tau": tau, "density": density,
                                  "kernel_ms": bench(lambda t=tau, c=chunked: two_pass(t, None, c),
                                                     L)})  # fmt: skip
        print(json.dumps(row), flush=True)
        out["chunks"].append(row)
    return out


def copy_bandwidth():
    """Device-to-device copy of 2 GiB: (bytes read + written) / time, TB/s (the memory ceiling)."""
    x = torch.empty(2**30, dtype=torch.int16, device="cuda").random_()
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=20, rep=200, return_mode="median")
    return 2 * 2**31 / (ms * 1e-3) / 1e12


def _sort_all(rects):
    return [torch.sort(r, dim=-1, descending=True, stable=True) for r in rects]


STEP1_VARIANTS = (("chunks", 4), ("chunks", 8), ("chunks", 16), ("full", None))


def step1_breakdown(q, k, S, setup):
    """Step 1 at one shape, per sort grouping (mode, number of chunks): the total, and the key
    scoring (fp32 products into the sort rectangles) and the sort of those rectangles timed
    apart; plus the total with an int32 kv_perm for the default grouping. Every number here is
    of the fp32-copy + cuBLAS scoring path (``"scores"`` in the record), so the parts add up to
    the totals; ``benchmarks/step1_probe.py`` profiles both scoring paths."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    n_seg = triton.cdiv(L, S)
    prefix = [n * S for n in range(n_seg)]
    out = {"keys": B * Hq * sum(prefix), "scores": "cublas_fp32", "variants": []}
    q_mean = step1_mod._segment_means(q, S).view(B, Hkv, Hq // Hkv, n_seg, D)
    kf = k.float()
    default_chunks, min_keys = step1_mod._MAX_SORT_CHUNKS, step1_mod._MIN_GROUP_KEYS
    step1_mod._MIN_GROUP_KEYS = 1  # the variants' chunk counts, not fewer for short L
    for mode, chunks in STEP1_VARIANTS:
        step1_mod._MAX_SORT_CHUNKS = chunks or default_chunks
        groups = step1_mod._sort_groups(prefix, B * Hq, mode)

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
                                                          fused_scores=False), L),
               "score_ms": bench(scores, L),
               "sort_ms": bench(lambda rects=rects: _sort_all(rects), L)}  # fmt: skip
        del rects
        out["variants"].append(row)
    step1_mod._MAX_SORT_CHUNKS, step1_mod._MIN_GROUP_KEYS = default_chunks, min_keys
    out["total_default_int32_ms"] = bench(
        lambda: s2o_step1(q, k, segment_len=S, index_dtype=torch.int32, fused_scores=False), L
    )
    return out


TUNE_CANDIDATES = {  # (num_warps, num_stages, sub_n) per head size
    64: ((4, 2, 128), (4, 3, 128), (8, 2, 128), (8, 3, 128), (4, 3, 64)),
    128: ((8, 2, 128), (8, 3, 128), (8, 5, 128), (4, 2, 128)),
    256: ((8, 2, 64), (8, 1, 128), (8, 2, 32), (8, 3, 32), (4, 2, 64), (8, 3, 64)),
}


def tune(q, k, v, perms, setup):
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
            cfg = Launch(num_warps=w, num_stages=st, sub_n=sub)
            trial = dataclasses.replace(setup, launch={**setup.launch, name: cfg})
            try:
                t = do_bench(lambda f=fn, s=trial: f(s), warmup=20, rep=100, return_mode="median")
            except Exception as e:  # out of shared memory etc.: recorded
                print(f"tune {name} {cfg}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                trials.append({"kernel": name, **vars(cfg), "error": type(e).__name__})
                continue
            print(f"tune {name} {cfg}: {t:.3f} ms", flush=True)
            trials.append({"kernel": name, **vars(cfg), "ms": t})
            if best is None or t < best[0]:
                best = (t, cfg)
        if best is not None:
            chosen[name] = best[1]
    return chosen, trials


def environment(rev):
    return {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda, "git_rev": git_revision(rev),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip


def markdown(record):
    env = record["env"]
    lines = [
        f"# S2O kernels vs SDPA on {env['gpu']}",
        "",
        f"torch {env['torch']}, Triton {env['triton']}, git {env['git_rev']}, {env['date']}. "
        f"B=1, Hq={record['shape']['Hq']}, Hkv={record['shape']['Hkv']}, "
        f"D={record['shape']['D']}, bf16, causal, S=2048, block 128x128, "
        f"input: structured synthetic (seed {SEED}). Median of do_bench, ms. Launch "
        f"(num_warps/num_stages/sub_n): "
        + ", ".join(
            f"{k} {v.get('num_warps')}/{v.get('num_stages')}/{v.get('sub_n')}"
            for k, v in record.get("launch", {}).items()
        )
        + f". Step 1: {record.get('step1_config')}. Command: `{record['env'].get('command')}`.",
        "",
        "| L | flash | cuDNN | Step1 S=2048 | kernel tau<=0 | total tau<=0 | total/flash "
        "| tau | density | kernel | kernel/(d x no-skip) | kernel discard | total "
        "| speedup vs flash | vs cuDNN |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["lengths"]:
        st1 = r["step1_ms"]["2048"]
        tot0 = st1 + r["s2o"]["noskip_ms"]
        for sp in r["s2o"]["sparse"]:
            tot = st1 + sp["kernel_ms"]
            ratio = sp["kernel_ms"] / (sp["density"] * r["s2o"]["noskip_ms"])
            lines.append(
                f"| {r['L']} | {r['flash_ms']:.2f} | {r['cudnn_ms'] or float('nan'):.2f} | "
                f"{st1:.2f} | {r['s2o']['noskip_ms']:.2f} | {tot0:.2f} | "
                f"{tot0 / r['flash_ms']:.3f} | {sp['tau']} | {sp['density']:.3f} | "
                f"{sp['kernel_ms']:.2f} | {ratio:.2f} | {sp['kernel_discard_ms']:.2f} | "
                f"{tot:.2f} | {r['flash_ms'] / tot:.2f} | "
                f"{(r['cudnn_ms'] or float('nan')) / tot:.2f} |"
            )
    lines += ["", "Step 1 (ms) by segment length S:", "",
              "| L | S=512 | S=1024 | S=2048 | S=4096 |", "|---|---|---|---|---|"]  # fmt: skip
    for r in record["lengths"]:
        s = r["step1_ms"]
        lines.append(
            f"| {r['L']} | "
            + " | ".join(f"{s[str(x)]:.3f}" for x in (512, 1024, 2048, 4096))
            + " |"
        )
    lines += ["", "No-skip variants (ms): two-pass, with stop logic on (tau=0; keep = deferred "
              "check, discard = check between the products), fused, passes:", "",
              "| L | two-pass | + stop logic keep | + stop logic discard | fused | pass1 | pass2 "
              "| TFLOP/s two-pass |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in record["lengths"]:
        s = r["s2o"]
        lines.append(
            f"| {r['L']} | {s['noskip_ms']:.2f} | {s['noskip_stoplogic_ms']:.2f} | "
            f"{s['noskip_stoplogic_discard_ms']:.2f} | "
            f"{s['fused_noskip_ms']:.2f} | {s['pass1_ms']:.2f} | {s['pass2_noskip_ms']:.2f} | "
            f"{s['noskip_tflops']:.0f} |"
        )
    if record.get("step1_breakdown"):
        b = record["step1_breakdown"]
        gb = b["keys"] * 1e-9
        lines += ["", f"Step 1 breakdown at L={b['L']}, S={b['S']} ({b['keys'] / 1e6:.0f}M ranked "
                  f"keys; copy bandwidth {record['copy_tb_s']:.2f} TB/s; default int64 kv_perm, "
                  f"int32: {b['total_default_int32_ms']:.2f} ms), ms:", "",
                  "| sort grouping | sort calls | sorted keys (M) | total | key scores | sort "
                  "| sort ns/key |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for v in b["variants"]:
            name = f"{v['mode']}" + (
                f" x{v['chunks']}" if v["mode"] == "chunks" else " (<128 rows)"
            )
            lines.append(f"| {name} | {v['calls']} | {v['sorted_keys'] / 1e6:.0f} | "
                         f"{v['total_ms']:.2f} | {v['score_ms']:.2f} | {v['sort_ms']:.2f} | "
                         f"{v['sort_ms'] / gb * 1e-3:.3f} |")  # fmt: skip
    for sw in record.get("sweep", []):
        lines += ["", f"Stop-check chunk sweep at L={sw['L']} (no-skip plain "
                  f"{sw['noskip_ms']:.2f} ms): two-pass kernel ms, D = stop logic on at tau=0; "
                  "ratio = kernel / (density x no-skip plain)", "",
                  "| chunk+growth | D | D/C | " + " | ".join(f"tau={x['tau']} (d, ms, ratio)"
                                                    for x in sw["chunks"][0]["sparse"]) + " |",
                  "|---|---|---|" + "---|" * len(sw["chunks"][0]["sparse"])]  # fmt: skip
        for c in sw["chunks"]:
            cells = [f"{x['density']:.3f}, {x['kernel_ms']:.2f}, "
                     f"{x['kernel_ms'] / (x['density'] * sw['noskip_ms']):.2f}"
                     for x in c["sparse"]]  # fmt: skip
            d_over_c = c["stoplogic_ms"] / sw["noskip_ms"]
            lines.append(f"| {c['chunk']}+{c.get('grow', 0)} | {c['stoplogic_ms']:.2f} | "
                         f"{d_over_c:.3f} | " + " | ".join(cells) + " |")  # fmt: skip
    if record.get("abcd"):
        from benchmarks.abcd import abcd_markdown

        lines += ["", *abcd_markdown(record["abcd"])]
    return "\n".join(lines) + "\n"


def run_length(B, Hq, Hkv, D, setup, L, taus, abcd):
    """Every timing for one sequence length."""
    torch.cuda.empty_cache()
    q, k, v = structured_qkv(B, Hq, Hkv, L, D)
    flash_cudnn, kr, vr = sdpa_times(q, k, v)
    del kr, vr
    step1 = {str(s): bench(lambda s=s: setup.step1(q, k, segment_len=s), L)
             for s in (512, 1024, 2048, 4096)}  # fmt: skip
    perms = setup.step1(q, k)
    rec = {"L": L, "flash_ms": flash_cudnn["flash"], "cudnn_ms": flash_cudnn["cudnn"],
           "step1_ms": step1, "s2o": s2o_times(q, k, v, perms, setup, taus)}  # fmt: skip
    del perms
    if abcd:
        from benchmarks.abcd import abcd_times

        rec["abcd"] = abcd_times(q, k, v, segment_len=1024, bench=lambda f: bench(f, L),
                                 launch=setup.launch, step1_kw=setup.step1_kw)  # fmt: skip
    print(json.dumps({"L": L, "flash": rec["flash_ms"], "cudnn": rec["cudnn_ms"], "step1": step1,
                      "s2o": rec["s2o"], "abcd": rec.get("abcd")}), flush=True)  # fmt: skip
    return rec


def save(record, out_dir):
    """Write ``bench_<gpu>.json`` and ``.md``; returns the markdown."""
    if any("abcd" in r for r in record["lengths"]):
        record["abcd"] = [{"L": r["L"], **r["abcd"]} for r in record["lengths"] if "abcd" in r]
    os.makedirs(out_dir, exist_ok=True)
    tag = torch.cuda.get_device_name().replace(" ", "_")
    sh = record["shape"]
    if (sh["Hq"], sh["Hkv"], sh["D"]) != (32, 8, 128):  # other shapes get their own files
        tag += f"_h{sh['Hq']}-{sh['Hkv']}_d{sh['D']}"
    with open(os.path.join(out_dir, f"bench_{tag}.json"), "w") as f:
        json.dump(record, f, indent=1)
    md = markdown(record)
    with open(os.path.join(out_dir, f"bench_{tag}.md"), "w") as f:
        f.write(md)
    return md


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8192,16384,32768,65536,131072")
    ap.add_argument("--taus", default="0.002,0.005,0.02")
    ap.add_argument("--abcd", action="store_true")
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
        help="pick (num_warps, num_stages, sub_n) per kernel at --tune-length and use them "
        "(default: the library's launch settings, what users get)",
    )
    ap.add_argument(
        "--step1-sort",
        default=None,
        choices=("chunks", "full", "cub"),
        help="Step-1 sort for every measurement (default: the library's)",
    )
    ap.add_argument("--int32-kv-perm", action="store_true", help="Step 1 writes int32 kv_perm")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", default="32/8", help="query/key-value heads, e.g. 4/1")
    ap.add_argument("--tune-length", type=int, default=16384, help="L of --tune")
    ap.add_argument("--rev", default=None)
    ap.add_argument("--out", default="results/kernels")
    args = ap.parse_args(argv)
    Hq, Hkv = (int(x) for x in args.heads.split("/"))
    B, D, S = 1, args.head_dim, 2048
    step1_kw = {"sort_mode": args.step1_sort,
                "index_dtype": torch.int32 if args.int32_kv_perm else None}  # fmt: skip
    setup = Setup(S=S, step1_kw={k: v for k, v in step1_kw.items() if v is not None})
    taus = [float(t) for t in args.taus.split(",")]
    record = {"env": environment(args.rev), "shape": dict(B=B, Hq=Hq, Hkv=Hkv, D=D, dtype="bf16",
              causal=True, segment_len=S, block_m=128, block_n=128, local_window=0),
              "generator": dict(seed=SEED, sink=SINK, heavy=HEAVY, n_heavy=N_HEAVY, local=LOCAL,
                                background=BACKGROUND, q_sink=Q_SINK),
              "stop_chunk": list(setup.stop_chunk or STOP_CHUNK),
              "step1_config": {"sort_mode": step1_kw["sort_mode"] or step1_mod.SORT_MODE,
                               "index_dtype": str(step1_kw["index_dtype"] or
                                                  step1_mod.INDEX_DTYPE)},
              "lengths": [], "sweep": []}  # fmt: skip
    record["env"]["command"] = "python3 benchmarks/bench_s2o.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    record["copy_tb_s"] = copy_bandwidth()
    print(f"copy bandwidth {record['copy_tb_s']:.2f} TB/s", flush=True)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.tune:
        q, k, v = structured_qkv(B, Hq, Hkv, args.tune_length, D)
        chosen, record["tune_trials"] = tune(q, k, v, setup.step1(q, k), setup)
        record["tune_length"] = args.tune_length
        setup = dataclasses.replace(setup, launch=chosen)
        del q, k, v
    record["launch"] = setup.resolved(D)
    if args.step1_breakdown:
        L = args.step1_breakdown
        q, k, _ = structured_qkv(B, Hq, Hkv, L, D)
        record["step1_breakdown"] = {"L": L, "S": S, **step1_breakdown(q, k, S, setup)}
        print(json.dumps(record["step1_breakdown"]), flush=True)
        del q, k
    for L in [int(x) for x in args.sweep.split(",") if x]:
        torch.cuda.empty_cache()
        q, k, v = structured_qkv(B, Hq, Hkv, L, D)
        pairs = [tuple(int(x) for x in p.split(":")) for p in args.sweep_chunks.split(",") if p]
        perms = setup.step1(q, k)
        record["sweep"].append(sweep_chunks(q, k, v, perms, setup, taus, tuple(pairs) or SWEEP))
        del q, k, v
        save(record, args.out)
    for L in lengths:
        record["lengths"].append(run_length(B, Hq, Hkv, D, setup, L, taus, args.abcd))
        save(record, args.out)  # after every length, so a cut-off run keeps what it measured
    print(save(record, args.out))


if __name__ == "__main__":
    main()
