"""Probe: where the two-pass kernel's time goes at low density, and what changes it (128K).

    PYTHONPATH=. python3 benchmarks/pass2_probe.py [--L 131072] [--baseline NAME=FILE ...]
        [--chunks] [--block-sparse] [--out DIR] [--rev SHA]

B=1, Hq=32, Hkv=8, D=128, bf16, S=2048, block 128x128, bench_s2o's structured input, Step 1 with
the library default. For the kernel module in the tree (as it is, and with the dense tiles'
TMA descriptor loads off) and for other copies of ``s2o_attention.py`` given as baselines (e.g.
``git show <rev>:s2o/kernels/s2o_attention.py > old.py``), it times Pass-1, Pass-2 with a zero
walk budget (the fixed cost of a query tile: its query, state and output traffic), the two-pass
kernel and the fused kernel at tau = 0, 0.002, 0.005, 0.02, checks that the visits equal the
first variant's and reports the largest output difference from it. ``--chunks`` adds the
stop-check chunking (first chunk, growth) at the sparse points. For scale: SDPA flash/cuDNN over
the same segment-diagonal causal blocks as Pass-1 (outputs only, K/V repeated beforehand).
Prints JSON lines; writes ``pass2_probe.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.bench_s2o import bench, environment, structured_qkv
from s2o.kernels import s2o_attention as tree_mod
from s2o.kernels import s2o_step1
from s2o.stats import dense_causal_tile_count, s2o_pass1_tile_count

TAUS = (0.0, 0.002, 0.005, 0.02)
CHUNKS = ((1, 0), (2, 0), (3, 0), (4, 0), (1, 1), (2, 1), (3, 1), (4, 1), (2, 2))


def load_module(path):
    spec = importlib.util.spec_from_file_location("baseline_s2o_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(mod, q, k, v, perms, geo, taus, ref=None, dense_kw=None, walk_kw=None):
    """``dense_kw`` (e.g. ``descriptors``) go to Pass-1 and the fused kernel, ``walk_kw`` (e.g.
    ``stop_chunk``) to Pass-2 and the fused kernel: a baseline module that predates them gets
    neither."""
    qp, kvp = perms
    L = q.shape[2]
    dense = dense_causal_tile_count(L, 128, 128)
    p1 = s2o_pass1_tile_count(L, geo["segment_len"], 0, 128, 128)
    dense_kw, walk_kw = dense_kw or {}, walk_kw or {}
    p1_geo, p2_geo, fused_geo = (
        {**geo, **dense_kw},
        {**geo, **walk_kw},
        {**geo, **dense_kw, **walk_kw},
    )
    state = mod.s2o_pass1(q, k, v, **p1_geo)
    row = {
        "pass1_ms": bench(lambda: mod.s2o_pass1(q, k, v, **p1_geo), L),
        "pass2_budget0_ms": bench(
            lambda: mod.s2o_pass2(q, k, v, state, qp, kvp, tau=0.0, walk_budget=0, **p2_geo), L
        ),
        "points": [],
    }

    def two_pass(tau):
        st = mod.s2o_pass1(q, k, v, **p1_geo)
        return mod.s2o_pass2(q, k, v, st, qp, kvp, tau=tau, **p2_geo)

    for tau in taus:
        out, visited = two_pass(tau)
        pt = {
            "tau": tau,
            "density": float((visited.double().sum(-1) + p1).mean()) / dense,
            "kernel_ms": bench(lambda t=tau: two_pass(t), L),
            "pass2_ms": bench(
                lambda t=tau: mod.s2o_pass2(q, k, v, state, qp, kvp, tau=t, **p2_geo), L
            ),
        }
        if ref is not None:
            r_out, r_vis = ref[tau]
            pt["same_visits"] = bool(torch.equal(visited, r_vis))
            pt["max_abs_diff_vs_first"] = float((out.float() - r_out.float()).abs().max())
        else:
            ref_store = row.setdefault("_outputs", {})
            ref_store[tau] = (out, visited)
        fused_out, fused_vis = mod.s2o_fused(q, k, v, kvp, tau=tau, **fused_geo)
        pt["fused_density"] = float((fused_vis.double().sum(-1) + p1).mean()) / dense
        pt["fused_ms"] = bench(lambda t=tau: mod.s2o_fused(q, k, v, kvp, tau=t, **fused_geo), L)
        row["points"].append(pt)
    return row


def segment_sdpa(q, k, v, S):
    """SDPA over the Pass-1 blocks (causal inside each segment of S tokens), for scale only."""
    B, Hq, L, D = q.shape
    n, group = L // S, Hq // k.shape[1]

    def seg(x):
        return x.view(B, x.shape[1], n, S, D).transpose(1, 2).reshape(B * n, x.shape[1], S, D)

    qs = seg(q)
    ks, vs = (seg(x.repeat_interleave(group, 1)) for x in (k, v))
    out = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):  # fmt: skip

        def run(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

        try:
            out[name + "_ms"] = bench(run, L)
        except RuntimeError as e:
            out[name + "_ms"] = None
            out[name + "_error"] = str(e)[:200]
    return out


def block_sparse_loads(q, k, v, densities=(0.05, 0.25)):
    """The block-sparse baselines' kernel at a random density, TMA descriptor loads vs pointer
    loads (128x128 blocks, diagonal always kept)."""
    from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists

    B, Hq, L, _ = q.shape
    nb = L // 128
    g = torch.Generator(device="cuda").manual_seed(0)
    tril = torch.ones(nb, nb, dtype=torch.bool, device="cuda").tril()
    rows = []
    for d in densities:
        mask = (torch.rand(B, Hq, nb, nb, generator=g, device="cuda") < d) & tril
        mask |= torch.eye(nb, dtype=torch.bool, device="cuda")
        idx, cnt = mask_to_lists(mask)
        row = {"density": float(mask.sum()) / (B * Hq * nb * (nb + 1) / 2)}
        outs = {}
        for name, desc in (("descriptor", None), ("pointer", False)):
            fn = lambda i=idx, c=cnt, d=desc: block_sparse_attention(  # noqa: E731
                q, k, v, i, c, block_size=128, descriptors=d
            )
            outs[name] = fn()
            row[name + "_ms"] = bench(fn, L)
        row["max_abs_diff"] = float(
            (outs["descriptor"].float() - outs["pointer"].float()).abs().max()
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=131072)
    ap.add_argument("--baseline", action="append", default=[],
                    help="NAME=FILE: another s2o_attention.py to compare (repeatable; the first "
                         "one's outputs and visits are the reference of the rest)")  # fmt: skip
    ap.add_argument("--out", default=None)
    ap.add_argument("--rev", default=None)
    ap.add_argument("--chunks", action="store_true", help="also sweep the stop-check chunking")
    ap.add_argument(
        "--block-sparse",
        action="store_true",
        help="also time the block-sparse kernel with and without descriptor loads",
    )
    args = ap.parse_args()
    L, S = args.L, 2048
    geo = dict(segment_len=S, local_window=0, block_m=128, block_n=128)
    q, k, v = structured_qkv(1, 32, 8, L, 128)
    perms = s2o_step1(q, k, segment_len=S)
    rec = {"env": environment(args.rev), "L": L, "S": S, "variants": {}}
    print(json.dumps(rec["env"]), flush=True)
    ref = None
    for spec in args.baseline:
        if "=" not in spec:
            ap.error(f"--baseline wants NAME=FILE, got {spec!r}")
        name, path = spec.split("=", 1)
        base = measure(load_module(path), q, k, v, perms, geo, TAUS, ref)
        ref = base.pop("_outputs", None) if ref is None else ref
        base.pop("_outputs", None)
        rec["variants"][name] = base
        print(json.dumps({name: base}), flush=True)
    for name, desc in (("tree", None), ("tree_pointer_loads", False)):
        row = measure(tree_mod, q, k, v, perms, geo, TAUS, ref, dense_kw={"descriptors": desc})
        ref = row.pop("_outputs", None) if ref is None else ref
        row.pop("_outputs", None)
        rec["variants"][name] = row
        print(json.dumps({name: row}), flush=True)
    if args.chunks:
        rec["chunks"] = []
        for n, grow in CHUNKS:
            row = measure(tree_mod, q, k, v, perms, geo, TAUS[1:],
                          walk_kw={"stop_chunk": (n, grow)})  # fmt: skip
            row.pop("_outputs", None)
            row.update(chunk=n, grow=grow)
            rec["chunks"].append(row)
            print(json.dumps(row), flush=True)
    if args.block_sparse:
        rec["block_sparse"] = block_sparse_loads(q, k, v)
    rec["segment_sdpa"] = segment_sdpa(q, k, v, S)
    print(json.dumps(rec["segment_sdpa"]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "pass2_probe.json"), "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
