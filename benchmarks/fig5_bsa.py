"""Fig. 5 (Appendix): S2O's top-k mode against block-sparse attention (BSA) at matched density,
non-causal, with SDPA flash (FlashAttention-2) as the dense baseline.

For every length L and top-k ratio r (defaults: L = 32K and 128K, r = 0.05 ... 0.7; B=1, 32 query
and 8 KV heads, D=128, bf16, S=2048, 128 x 128 tiles):

* **S2O top-k** (``topk_ratio=r``, ``tau=0``): every query tile computes its own segment densely
  (Pass-1) and the first ``ceil(r x ranked tiles)`` key tiles of its ranked prefix, gathered
  through ``kv_perm`` with no stop logic: the paper's "top-k selection based on Kernel C".
  Estimation = Step 1 (non-causal ranking); attention = Pass-1 + Pass-2 (``s2o_topk``), and the
  fused single-pass kernel (``s2o_topk_fused``) on the same Step-1 output.
* **BSA**: the project's block-sparse kernel (``s2o/kernels/block_sparse.py``, ``causal=False``)
  with a per-query-block top-k key-block mask on the same 128 x 128 tiles. Selection: q and k
  mean-pooled per block, block score ``q_mean . k_mean``, the best ``k`` key blocks per query
  block. A deliberately plain rule: Fig. 5 compares runtime at matched sparsity, not selection
  quality. Estimation = pooling, scores, top-k and the kernel's index lists. ``k``:
  ``--bsa-budget matched`` (default) gives each query block exactly as many tiles as S2O computes
  for that query tile (own segment + walked tiles), so both densities are equal by construction
  (and both are measured); ``ratio`` gives ``ceil(r x key blocks)`` (S2O then computes more: its
  dense own segment).
* **flash**: SDPA's flash backend, non-causal (K/V repeated for GQA outside the timing).

Density = tiles computed / all ``ceil(L/128)^2`` tiles (non-causal), mean over heads.
``speedup`` = flash ms / attention ms; ``speedup_incl_estimate`` = flash ms / (estimate +
attention) ms. Times are ``triton.testing.do_bench`` medians after warm-up.

Input: :func:`benchmarks.common.make_qkv` (the harness's synthetic generator). In the top-k mode
the number of tiles does not depend on the input; the input only decides which tiles (S2O's
ranked order is then a scattered gather, as in the paper's kernel C).

GPU:  ``python -m benchmarks.fig5_bsa --rev <git sha>``
CPU:  ``--smoke`` runs tiny fp16 shapes under the Triton interpreter to check the script (its
times mean nothing; the record says ``smoke``). Writes one record
(:class:`benchmarks.common.Recorder`, ``metrics.rows``); the table and figure come from
``analysis/fig5_bsa.py``.
"""

from __future__ import annotations

import argparse
import math

from benchmarks import common

SMOKE = common.early_smoke_switch()

import torch  # noqa: E402

from s2o.kernels import s2o_fused, s2o_pass1, s2o_pass2, s2o_step1  # noqa: E402
from s2o.kernels.block_sparse import block_sparse_attention, mask_to_lists  # noqa: E402
from s2o.methods.blocksparse import grouped_scores, mean_pool_tokens, rank_select  # noqa: E402
from s2o.stats import _cdiv, s2o_pass2_tile_max, s2o_stats  # noqa: E402

PAPER_GEOMETRY = dict(S=2048, block=128)
# fp16 under the interpreter (bf16 tl.dot is wrong there); 64-key segments of two 32-key tiles
SMOKE_SHAPE = common.Shape(B=1, Hq=4, Hkv=2, D=64, dtype="float16", device="cpu")
SMOKE_GEOMETRY = dict(S=64, block=32)
LENGTHS, RATIOS = "32768,131072", "0.05,0.1,0.2,0.3,0.5,0.7"
SMOKE_LENGTHS, SMOKE_RATIOS = "160,256", "0.2,0.5"


# ----------------------------------------------------------------------------- the two methods


def s2o_tiles_per_query_tile(L: int, S: int, block: int, ratio: float) -> list[int]:
    """Tiles S2O's top-k mode computes per query tile, non-causal, no window: its own segment
    (Pass-1) plus the walked ranked tiles (Pass-2), in query-tile order."""
    own = []
    for s in range(0, L, S):
        e = min(s + S, L)
        own += [_cdiv(e - s, block)] * _cdiv(e - s, block)
    walked = s2o_pass2_tile_max(L, S, 0, block, block, None, causal=False, topk_ratio=ratio)
    return [a + b for a, b in zip(own, walked)]


def bsa_select(q, k, counts: torch.Tensor, block: int):
    """BSA's top-k mask: ``counts [NB]`` best key blocks per query block by mean-pooled ``q . k``
    block scores. Returns ``(mask [B, Hq, NB, NB] bool, kv_idx, kv_count)``."""
    qm, km = mean_pool_tokens(q, block), mean_pool_tokens(k, block)
    scores = grouped_scores(qm.to(q.dtype), km.to(k.dtype), 1.0)
    mask = rank_select(scores, counts.expand(scores.shape[:-1]))
    kv_idx, kv_count = mask_to_lists(mask)
    return mask, kv_idx, kv_count


def time_step1(q, k, L, cfg, bench):
    """S2O's estimation, Step 1 (non-causal ranking; it does not depend on the ratio): ``(ms,
    (q_perm, kv_perm))``."""
    step1 = lambda: s2o_step1(q, k, segment_len=cfg["S"], causal=False)  # noqa: E731
    return bench(step1, L), step1()


def time_s2o(q, k, v, L, ratio, perms, cfg, bench):
    """S2O top-k on Step 1's ``perms``: Pass-1 + Pass-2 and the fused kernel (attention);
    densities from the kernels' own visit counts."""
    geo = dict(segment_len=cfg["S"], local_window=0, block_m=cfg["block"],
               block_n=cfg["block"], causal=False)  # fmt: skip
    qp, kvp = perms
    walk = dict(tau=0.0, topk_ratio=ratio, **geo)

    def two_pass():
        return s2o_pass2(q, k, v, s2o_pass1(q, k, v, **geo), qp, kvp, **walk)

    def fused():
        return s2o_fused(q, k, v, kvp, **walk)

    rows = {}
    for name, fn in (("s2o_topk", two_pass), ("s2o_topk_fused", fused)):
        _, visited = fn()
        stats = s2o_stats(visited.cpu(), L, cfg["S"], 0, cfg["block"], cfg["block"], None,
                          causal=False, topk_ratio=ratio)  # fmt: skip
        rows[name] = dict(density=stats.density, attention_ms=bench(fn, L))
    return rows


def time_bsa(q, k, v, L, counts, cfg, bench):
    """BSA: selection (estimate) and the block-sparse kernel (attention), measured density."""
    block = cfg["block"]
    mask, kv_idx, kv_count = bsa_select(q, k, counts, block)
    est = bench(lambda: bsa_select(q, k, counts, block), L)

    def attend():
        return block_sparse_attention(q, k, v, kv_idx, kv_count, block_size=block, causal=False)

    nb = mask.shape[-1]
    density = float(mask.sum((-1, -2), dtype=torch.float64).mean()) / (nb * nb)
    return dict(density=density, estimate_ms=est, attention_ms=bench(attend, L))


def time_flash(q, k, v, L, bench):
    """SDPA non-causal: the flash backend on CUDA, PyTorch's default on the CPU."""
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not q.is_cuda:
        return bench(lambda: sdpa(q, kr, vr), L)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, kr, vr)

    return bench(run, L)


def measure_length(L, ratios, cfg, shape: common.Shape) -> list[dict]:
    """Every row of one length: S2O (two-pass, fused) and BSA at each ratio, flash beside them."""
    q, k, v = common.make_qkv(cfg["input"], shape, L, cfg["seed"])
    device = shape.device
    t = common.timer(shape, rep_ms=200 if L <= 16384 else 1000)
    bench = lambda fn, L: t(fn)  # noqa: E731
    flash = time_flash(q, k, v, L, bench)
    step1_ms, perms = time_step1(q, k, L, cfg, bench)
    nb = _cdiv(L, cfg["block"])
    dense_flop = 4.0 * L * L * shape.D * shape.Hq * shape.B
    rows = []
    for r in ratios:
        tiles = s2o_tiles_per_query_tile(L, cfg["S"], cfg["block"], r)
        if cfg["bsa_budget"] == "matched":
            counts = torch.tensor(tiles, device=device)
        else:
            counts = torch.full((nb,), math.ceil(r * nb), device=device)
        found = time_s2o(q, k, v, L, r, perms, cfg, bench)
        for m in found.values():
            m["estimate_ms"] = step1_ms
        found["bsa"] = time_bsa(q, k, v, L, counts.clamp(max=nb), cfg, bench)
        for method, m in found.items():
            total = m["estimate_ms"] + m["attention_ms"]
            rows.append({
                "L": L, "ratio": r, "method": method, **m, "flash_ms": flash,
                "speedup": flash / m["attention_ms"], "speedup_incl_estimate": flash / total,
                "tflops": dense_flop * m["density"] / (m["attention_ms"] * 1e-3) / 1e12,
            })  # fmt: skip
            common.log(rows[-1])
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default=None, help=f"default {LENGTHS} ({SMOKE_LENGTHS} smoke)")
    ap.add_argument("--ratios", default=None, help=f"default {RATIOS} ({SMOKE_RATIOS} smoke)")
    ap.add_argument("--bsa-budget", choices=("matched", "ratio"), default="matched")
    common.add_common_args(ap)
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run on a GPU, or pass --smoke for the CPU check")
    shape = SMOKE_SHAPE if args.smoke else common.Shape.from_args(args)
    lengths = [int(x) for x in (args.lengths or (SMOKE_LENGTHS if args.smoke else LENGTHS))
               .split(",")]  # fmt: skip
    ratios = [float(x) for x in (args.ratios or (SMOKE_RATIOS if args.smoke else RATIOS))
              .split(",")]  # fmt: skip
    flash = "PyTorch's default SDPA on the CPU" if args.smoke else "SDPA flash backend"
    cfg = {**(SMOKE_GEOMETRY if args.smoke else PAPER_GEOMETRY), "lengths": lengths,
           "ratios": ratios, "bsa_budget": args.bsa_budget, "causal": False,
           "input": args.input, "seed": args.seed, "flash": flash,
           "smoke": args.smoke}  # fmt: skip
    rec = common.Recorder("fig5_bsa", cfg, common.command_line("benchmarks.fig5_bsa", argv),
                          shape, args.out, args.rev, metrics={"rows": []})  # fmt: skip
    for L in lengths:
        common.free_memory()
        rec.metrics["rows"] += measure_length(L, ratios, cfg, shape)
        rec.save()  # after every length: a cut-off run keeps its rows
    print(rec.save(done=True))
    return rec.record


if __name__ == "__main__":
    main()
