"""Overhead decomposition of the S2O kernel (paper Appendix, tables A/B/C/D), causal.

All four variants run Pass-1 + Pass-2 of our own kernels over exactly the same tiles (every causal
tile, nothing skipped); each adds one mechanism to the previous one:

* A, dense: original query order, contiguous key tiles (no index arrays read at all);
* B, indexed sequential: queries and keys gathered through identity index arrays;
* C, indexed sorted: the real Step-1 ``q_perm``/``kv_perm`` (non-contiguous rows);
* D, early-stop logic: C plus the stop-rule control flow (gain vs ``tau * l``, a while loop over
  chunks of tiles) at ``tau = 0``, which never stops; ``stop_tile="keep"`` (the paper's deferred
  check, our default). ``D_discard`` is the same with ``"discard"`` (the check sits between the
  two products), recorded next to it.

Used by ``benchmarks/bench_s2o.py --abcd``; standalone: ``PYTHONPATH=. python3 benchmarks/abcd.py``.
"""

from __future__ import annotations

import torch

from s2o.kernels import s2o_pass1, s2o_pass2, s2o_step1

# Paper Table "ABCD decomposition (Causal)": A100, bf16, B=1, H=32, D=128, seg_len=1024, ms
PAPER_CAUSAL = {
    "A": {8192: 3.38, 16384: 11.95, 32768: 44.67, 65536: 175.40, 131072: 717.49},
    "B": {8192: 3.65, 16384: 12.63, 32768: 47.33, 65536: 186.56, 131072: 759.61},
    "C": {8192: 3.65, 16384: 12.65, 32768: 47.20, 65536: 184.34, 131072: 744.75},
    "D": {8192: 3.93, 16384: 13.73, 32768: 51.31, 65536: 200.10, 131072: 807.92},
}


def identity_perms(B, Hq, L, segment_len, device):
    """``q_perm`` = positions in order, ``kv_perm[n]`` = ``0..P_n-1`` padded with -1."""
    n_seg = -(-L // segment_len)
    p_max = (n_seg - 1) * segment_len
    qp = torch.arange(L, device=device).expand(B, Hq, L).contiguous()
    cols = torch.arange(p_max, device=device)
    prefix = torch.arange(n_seg, device=device)[:, None] * segment_len
    kvp = torch.where(cols < prefix, cols, -1).expand(B, Hq, n_seg, p_max).contiguous()
    return qp, kvp


def abcd_times(q, k, v, *, segment_len, bench, launch=None, step1_kw=None):
    """ms of variants A-D (Pass-1 + Pass-2) for one input; ``bench(fn) -> ms``; ``launch``
    ``{kernel: Launch}`` and ``step1_kw`` (Step 1's options) go to every call."""
    B, Hq, L, _ = q.shape
    launch = launch or {}
    geo = dict(segment_len=segment_len, local_window=0, block_m=128, block_n=128)
    ident = identity_perms(B, Hq, L, segment_len, q.device)
    ranked = s2o_step1(q, k, segment_len=segment_len, **(step1_kw or {}))
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


def abcd_markdown(rows):
    """Markdown lines: our A-D, the marginal overheads, and the paper's (A100) next to them."""
    lines = [
        "ABCD decomposition, causal, S=1024, kernel only (Pass-1 + Pass-2), ms; paper: A100.",
        "",
        "| L | A | B | C | D | A->B | B->C | C->D | A->D | paper A->B | paper B->C | paper C->D "
        "| paper A->D | D discard | C->D discard |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda a, b: f"{100 * (b / a - 1):+.1f}%"
    for r in rows:
        L = r["L"]
        p = {x: PAPER_CAUSAL[x].get(L) for x in "ABCD"}
        paper = (
            [pct(p["A"], p["B"]), pct(p["B"], p["C"]), pct(p["C"], p["D"]), pct(p["A"], p["D"])]
            if p["A"]
            else ["-"] * 4
        )
        lines.append(
            f"| {L} | {r['A']:.2f} | {r['B']:.2f} | {r['C']:.2f} | {r['D']:.2f} | "
            f"{pct(r['A'], r['B'])} | {pct(r['B'], r['C'])} | {pct(r['C'], r['D'])} | "
            f"{pct(r['A'], r['D'])} | "
            + " | ".join(paper)
            + " | "
            + (
                f"{r['D_discard']:.2f} | {pct(r['C'], r['D_discard'])} |"
                if "D_discard" in r
                else "- | - |"
            )  # fmt: skip
        )
    return lines


if __name__ == "__main__":
    from triton.testing import do_bench

    from benchmarks.bench_s2o import structured_qkv

    for L in (8192, 32768):
        q, k, v = structured_qkv(1, 32, 8, L, 128)
        r = abcd_times(q, k, v, segment_len=1024, bench=lambda f: do_bench(f, return_mode="median"))
        print("\n".join(abcd_markdown([{"L": L, **r}])))
