"""Attention heatmaps under the permutations of the paper's Fig. 2 and appendix, as a small record.

    S2O_CACHE=cache python -m experiments.attention_maps --model smollm2_135m --L 4096 \
        --layers 15 --heads 0 4 --S 1024 --out results/captures/heatmaps_smollm2_135m_L4096

For each (input, layer, query head) it computes the causal softmax ``A [L, L]`` (fp32, the
model's ``1/sqrt(D)`` scale) and four views of it:

* ``original``: ``A`` as is.
* ``pbs``: PBS's permutation (``s2o.methods.pbs.key_permutation``, block 128, segment 256 as the
  paper's setting): keys sorted by importance inside each 256-key segment; queries unpermuted.
* ``s2o_no_qperm``: S2O's Step 1 (``s2o.reference.s2o_permutations``): in the rows of segment
  ``n`` the ranked prefix ``kv_perm[n]`` comes first (descending ``<q_mean[n], k>``), then the
  segment's own keys in token order; queries in token order.
* ``s2o``: the same with each segment's queries in ``q_perm`` order.

The record keeps, per view, ``A`` mean-pooled to ``pixels x pixels`` cells as ``log10`` quantized to
uint8 (``-8..0`` in 255 steps; 255 = masked), and the number that the picture shows: over the
ranked prefixes (what Pass-2 walks), the fraction of ``tile x tile`` tiles that hold 90% / 99% of
their attention mass, and the share of all attention mass that lies in the prefixes.
Nothing else of the tensors is stored (each file well under 1 MB). Inputs: a model's post-RoPE Q/K
(``eval.data.model_input``, data=model: Paul Graham's essays, truncated to ``L`` tokens) or the
synthetic generator (``--synthetic``, a ``conf/data/*.yaml`` file). Both files are written
atomically, the JSON by :func:`experiments.records.write_record`, with ``git_revision`` and
``environment`` from :mod:`experiments.provenance`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

from eval.data import model_input
from s2o.methods.pbs import key_permutation
from s2o.reference import s2o_permutations, segment_ranges

from .provenance import environment, git_revision
from .records import write_record

ROOT = Path(__file__).resolve().parents[1]
VIEWS = ("original", "pbs", "s2o_no_qperm", "s2o")
LOG_MIN = -8.0
MASKED = 255


def softmax_map(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal softmax ``[L, L]`` fp32 of one head, ``q [L, D]``, ``k [L, D]``; masked = 0."""
    s = (q.float() @ k.float().T) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(dim=-1)


def view_indices(q, k, head: int, S: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per view, ``(rows [L], cols [L, L])``: the displayed cell ``(r, c)`` is
    ``A[rows[r], cols[r, c]]`` (``cols = -1``: masked).

    ``q [1, Hq, L, D]``, ``k [1, Hkv, L, D]``."""
    L = q.shape[2]
    ident = torch.arange(L)
    grid = ident.expand(L, L)
    causal = torch.where(grid <= ident[:, None], grid, -1)
    pbs = key_permutation(q, k, block_size=128, segment_size=256, scale=1 / math.sqrt(q.shape[-1]))
    pcols = pbs[0, head].expand(L, L)
    pcols = torch.where(pcols <= ident[:, None], pcols, -1)
    q_perm, kv_perm = s2o_permutations(q, k, S)
    s2o_cols = torch.full((L, L), -1, dtype=torch.long)
    for n, (s, e) in enumerate(segment_ranges(L, S)):
        ranked = kv_perm[0, head, n, :s]  # P_n = s with no local window
        s2o_cols[s:e, :s] = ranked
        s2o_cols[s:e, s:e] = torch.where(grid[s:e, s:e] <= ident[s:e, None], grid[s:e, s:e], -1)
    return {
        "original": (ident, causal),
        "pbs": (ident, pcols),
        "s2o_no_qperm": (ident, s2o_cols),
        "s2o": (q_perm[0, head], s2o_cols[q_perm[0, head]]),
    }


def gather_view(a: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Displayed matrix ``[L, L]``, NaN where masked; the causal prefix of each row keeps the row's
    query (rows of the S2O view are permuted together with their column order)."""
    m = a[rows[:, None], cols.clamp_min(0)]
    return m.masked_fill(cols < 0, float("nan"))


def pool_log(m: torch.Tensor, pixels: int) -> np.ndarray:
    """Mean of each ``f x f`` cell (masked cells excluded) -> ``log10`` quantized to uint8."""
    L = m.shape[0]
    f = L // pixels
    x = m[: f * pixels, : f * pixels].reshape(pixels, f, pixels, f)
    valid = ~torch.isnan(x)
    mass = torch.nan_to_num(x).sum(dim=(1, 3))
    mean = mass / valid.sum(dim=(1, 3)).clamp_min(1)
    logm = torch.log10(mean.clamp_min(10**LOG_MIN)).clamp(LOG_MIN, 0.0)
    q = torch.round((logm - LOG_MIN) / -LOG_MIN * 254).to(torch.uint8)
    q[valid.sum(dim=(1, 3)) == 0] = MASKED
    return q.numpy()


def tiles_for_mass(m: torch.Tensor, tile: int, S: int, fracs=(0.9, 0.99)) -> dict[str, float]:
    """Over the ranked prefixes (rows of segment ``n >= 1``, columns before the segment: what
    S2O's Pass-2 walks and a block-sparse method selects from; the own segment is computed densely
    by every method), the fraction of ``tile x tile`` tiles that, taken by descending mass, hold
    ``frac`` of the prefix mass. Every view permutes rows inside a segment and prefix columns
    inside the prefix, so the region and its total mass are the same for all views."""
    masses = []
    for s, e in segment_ranges(m.shape[0], S)[1:]:
        x = torch.nan_to_num(m[s:e, :s])
        nr, nc = -(-(e - s) // tile), -(-s // tile)
        x = torch.nn.functional.pad(x, (0, nc * tile - s, 0, nr * tile - (e - s)))
        masses.append(x.reshape(nr, tile, nc, tile).sum(dim=(1, 3)).flatten())
    mass = torch.cat(masses)
    srt = mass.sort(descending=True).values.cumsum(0) / mass.sum()
    return {f"{f:g}": (int((srt < f).sum()) + 1) / mass.numel() for f in fracs}


def maps_for_head(q, k, head: int, S: int, pixels: int, tile: int) -> dict:
    """``({view: {"map": uint8 [pixels, pixels], "tiles_for_mass": {...}}}, prefix mass share)``
    for one query head (the share: the attention mass in the ranked prefixes / all mass)."""
    group = q.shape[1] // k.shape[1]
    a = softmax_map(q[0, head], k[0, head // group])
    out = {}
    for name, (rows, cols) in view_indices(q, k, head, S).items():
        m = gather_view(a, rows, cols)
        out[name] = {"map": pool_log(m, pixels), "tiles_for_mass": tiles_for_mass(m, tile, S)}
    prefix = sum(float(a[s:e, :s].sum()) for s, e in segment_ranges(a.shape[0], S)[1:])
    return out, prefix / a.shape[0]


def synthetic_input(data_file: str, L: int, heads: tuple[int, int, int] | None):
    """Synthetic Q/K/V of a ``conf/data/*.yaml`` file (its ``seed: ${seed}`` resolved to 0)."""
    from omegaconf import OmegaConf

    from eval.synthetic import spec_from_cfg, synthetic_qkv

    cfg = OmegaConf.load(ROOT / data_file)
    cfg = OmegaConf.to_container(OmegaConf.merge({"seed": 0}, {"d": cfg}), resolve=True)["d"]
    cfg["L"] = L
    if heads:
        cfg.update(heads_q=heads[0], heads_kv=heads[1], head_dim=heads[2])
    spec = spec_from_cfg(cfg)
    q, k, v = synthetic_qkv(spec)
    info = {"synthetic": data_file, "L": L, "spec": {k_: v_ for k_, v_ in cfg.items()}}
    return [(0, q, k, v)], info


def write_maps(out: Path, entries: list[dict], meta: dict) -> dict:
    """``out.npz`` (the uint8 maps, keyed ``<entry>/<view>``) and ``out.json`` (everything else,
    written by :func:`experiments.records.write_record`), each atomically: the maps first, so a
    record never names maps that are not there. Returns the record."""
    arrays = {}
    for e in entries:
        for view, d in e.pop("views").items():
            arrays[f"{e['key']}/{view}"] = d.pop("map")
            e.setdefault("tiles_for_mass", {})[view] = d["tiles_for_mass"]
    maps = out.with_suffix(".npz")
    maps.parent.mkdir(parents=True, exist_ok=True)
    tmp = maps.with_name(f".{maps.stem}.{os.getpid()}.tmp.npz")  # savez keeps a .npz name as is
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, maps)
    rec = {**meta, "entries": entries, "maps": maps.name}
    write_record(out.with_suffix(".json"), rec)
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="conf/model/<name>.yaml (data=model, the essays)")
    src.add_argument("--synthetic", help="a conf/data/*.yaml synthetic file")
    ap.add_argument("--synthetic-heads", type=int, nargs=3, metavar=("HQ", "HKV", "D"))
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--layers", type=int, nargs="*", default=[15])
    ap.add_argument("--heads", type=int, nargs="+", default=[0])
    ap.add_argument("--S", type=int, default=1024, help="S2O segment length")
    ap.add_argument("--pixels", type=int, default=256)
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True, help="record path without suffix")
    ap.add_argument(
        "--rev",
        default=None,
        help="the code revision to record (default: $S2O_GIT_REV, else git HEAD)",
    )
    args = ap.parse_args(argv)
    if args.model:
        layers, info = model_input(args.model, args.L, args.layers)
        info.pop("cache", None), info.pop("cache_hit", None)  # machine paths: not in the record
    else:
        layers, info = synthetic_input(args.synthetic, args.L, args.synthetic_heads)
    entries = []
    for layer, q, k, _ in layers:
        for h in args.heads:
            views, prefix = maps_for_head(q, k, h, args.S, args.pixels, args.tile)
            entries.append(
                {
                    "key": f"layer{layer}_head{h}",
                    "layer": layer,
                    "head": h,
                    "prefix_mass": prefix,
                    "views": views,
                }
            )
            print(layer, h, {v: views[v]["tiles_for_mass"] for v in VIEWS}, flush=True)
    meta = {
        "input": info,
        "S": args.S,
        "pixels": args.pixels,
        "tile": args.tile,
        "pbs": {"block_size": 128, "segment_size": 256},
        "log10_range": [LOG_MIN, 0.0],
        "command": "python -m experiments.attention_maps " + " ".join(argv or sys.argv[1:]),
        "git_revision": git_revision(args.rev),
        "environment": environment("cpu", args.rev),  # every input is computed on the CPU
    }
    write_maps(args.out, entries, meta)
    print(args.out.with_suffix(".json"))


if __name__ == "__main__":
    main()
