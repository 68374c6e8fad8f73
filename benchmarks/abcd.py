"""Overhead decomposition of the S2O kernel (paper Appendix, tables "ABCD decomposition (Causal)"
and "(Non-causal)"), causal and non-causal.

All variants run Pass-1 + Pass-2 of our own kernels over exactly the same number of tiles (tau=0:
nothing skipped); each adds one mechanism to the previous one:

* A, dense: original query order, contiguous key tiles ``0..P-1`` (no index arrays read). In the
  non-causal case these are the first ``P`` keys, not the keys outside the own segment: the same
  amount of work, not the same output (A is a timing baseline);
* B, indexed sequential: queries and keys gathered through identity index arrays (the keys of each
  segment's ranked set, in token order);
* C, indexed sorted: the real Step-1 ``q_perm``/``kv_perm`` (non-contiguous rows);
* D, early-stop logic: C plus the stop-rule control flow (gain vs ``tau * l``, a while loop over
  chunks of tiles) at ``tau = 0``, which never stops; ``stop_tile="keep"`` (the paper's deferred
  check, our default). ``D_discard`` is the same with ``"discard"`` (the check sits between the
  two products), recorded next to it.

Shape B=1, 32 query / 8 KV heads, D=128, bf16, S=1024 (the paper's), block 128 x 128, W=0; input
:func:`benchmarks.common.make_qkv`. Step 1 is not timed. The record's ``metrics.rows``: one row
per (L, causal) with the ms of each variant.

    python -m benchmarks.abcd --rev <sha>                       # GPU, 8K..128K, both cases
    python -m benchmarks.abcd --smoke --out /tmp/bench          # CPU check of the script
"""

from __future__ import annotations

import argparse

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

from s2o.kernels import s2o_pass1, s2o_pass2, s2o_step1  # noqa: E402

VARIANTS = ("A", "B", "C", "D", "D_discard")


def identity_perms(B, Hq, L, segment_len, device, causal=True):
    """Step 1's layouts in token order: ``q_perm`` = positions, ``kv_perm[n]`` = the keys that
    row ``n`` ranks (causal: ``0..nS-1``; non-causal: every key outside segment ``n``),
    ascending, padded with -1 (W = 0)."""
    n_seg = -(-L // segment_len)
    pos = torch.arange(L, device=device)
    qp = pos.expand(B, Hq, L).contiguous()
    start = torch.arange(n_seg, device=device)[:, None] * segment_len
    if causal:
        keep = pos[None, : (n_seg - 1) * segment_len] < start
    else:
        keep = (pos[None, :] < start) | (pos[None, :] >= start + segment_len)
    p_max = int(keep.sum(-1).max())
    # stable sort puts the kept keys first, in token order
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[:, :p_max]
    rows = torch.where(torch.gather(keep, 1, order), order, -1)
    return qp, rows.expand(B, Hq, n_seg, p_max).contiguous()


def abcd_times(q, k, v, *, segment_len, bench, block=128, causal=True, launch=None,
               step1_kw=None):  # fmt: skip
    """ms of the variants (Pass-1 + Pass-2) for one input; ``bench(fn) -> ms``; ``launch``
    ``{kernel: Launch}`` and ``step1_kw`` (Step 1's options) go to every call."""
    B, Hq, L, _ = q.shape
    launch = launch or {}
    geo = dict(segment_len=segment_len, local_window=0, block_m=block, block_n=block,
               causal=causal)  # fmt: skip
    ident = identity_perms(B, Hq, L, segment_len, q.device, causal)
    ranked = s2o_step1(q, k, segment_len=segment_len, causal=causal, **(step1_kw or {}))
    variants = {
        "A": (ident, dict(use_qperm=False, gather=False, early_stop=False)),
        "B": (ident, dict(use_qperm=True, gather=True, early_stop=False)),
        "C": (ranked, dict(use_qperm=True, gather=True, early_stop=False)),
        "D": (ranked, dict(use_qperm=True, gather=True, early_stop=True)),
        "D_discard": (ranked, dict(use_qperm=True, gather=True, early_stop=True,
                                   stop_tile="discard")),
    }  # fmt: skip
    out = {}
    for name, ((qp, kvp), flags) in variants.items():

        def run(qp=qp, kvp=kvp, flags=flags):
            state = s2o_pass1(q, k, v, launch=launch.get("pass1"), **geo)
            return s2o_pass2(q, k, v, state, qp, kvp, tau=0.0, launch=launch.get("pass2"),
                             **flags, **geo)  # fmt: skip

        out[name] = bench(run)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8192,16384,32768,65536,131072")
    ap.add_argument("--segment-len", type=int, default=1024)
    ap.add_argument("--block", type=int, default=128, help="block_m = block_n")
    ap.add_argument("--cases", default="causal,noncausal", help="causal, noncausal or both")
    common.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.smoke:  # 4 segments of 2 tiles: every variant has a ranked prefix to walk
        args.lengths, args.segment_len, args.block = "128", 32, 16
    args.cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in args.cases if c not in ("causal", "noncausal")]
    if bad or not args.cases:
        ap.error(f"--cases {','.join(bad) or '(empty)'}: give causal and/or noncausal")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    shape = common.Shape.from_args(args)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    config = {"lengths": lengths, "segment_len": args.segment_len, "block": args.block,
              "cases": args.cases, "input": args.input, "seed": args.seed, "local_window": 0,
              "tau": 0.0, "smoke": args.smoke}  # fmt: skip
    rec = common.Recorder("abcd", config, common.command_line("benchmarks.abcd", argv), shape,
                          args.out, args.rev, metrics={"rows": []})  # fmt: skip
    for L in lengths:
        common.free_memory()
        q, k, v = common.make_qkv(args.input, shape, L, args.seed)
        bench = common.timer(shape, warmup_ms=50, rep_ms=200 if L <= 16384 else 1500)
        for case in args.cases:
            row = {"L": L, "causal": case == "causal"}
            row.update(abcd_times(q, k, v, segment_len=args.segment_len, bench=bench,
                                  block=args.block, causal=row["causal"]))  # fmt: skip
            common.log(row)
            rec.metrics["rows"].append(row)
            rec.save()
        del q, k, v
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
