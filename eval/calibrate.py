"""Fit the synthetic generator's knobs to statistics of real captured attention: the statistics
and the fit. The command that runs a fit and writes its record is ``experiments/calibration_fit.py``
(eval imports no ``experiments``: the record's writer and provenance live there).

Statistics of one head's causal attention (``attention_stats``), over the rows of the second half
(every ``row_step``-th row; those rows see every key of the first half):

* ``sink``: mean probability of key 0 (the attention sink);
* ``heavy``: mean mass on the ``n_heavy`` keys of the first half (past the local band) with the
  largest mean probability, key 0 excluded (vertical stripes, heavy hitters);
* ``local``: mean mass on the last ``LOCAL`` keys before and at the query (slash locality);
* ``background_std``: mean over rows of the standard deviation of the logits ``q.k/sqrt(D)`` of the
  remaining keys (not the sink, heavy or local ones): the spread of the diffuse background;
* ``row_spread``: standard deviation over rows of ``log mean exp`` of those logits: how much some
  queries score higher than others overall (horizontal stripes, row sharpness);
* ``keys90``: median over rows of the fraction of the causal keys that hold 90% of the row's mass
  (how concentrated a row is);
* ``tile_keys90``: the same for the mass of a tile of 128 consecutive query rows on the keys
  before it, key 0 aside (whether the rows of a tile share their important keys: what a
  tile-sparse method, S2O included, can skip);
* ``band_excess``: the mean logit at offsets 96-159 over the median logit of the keys 256 or more
  back (how far locality reaches past the last ``LOCAL`` keys: on SmolLM2 it decays over hundreds
  of tokens);
* ``tile_share``, ``block_scatter``, ``tile_overlap`` (``tile_sharing``): whether a tile's rows
  share their important far keys, whether those keys are scattered over key blocks or packed
  into few, and how long they persist from tile to tile;
* ``head_spread`` (``median_stats``, across heads): the standard deviation of ``log keys90`` over
  the heads of one layer, median over layers (how unequally sharp a layer's heads are).

The target is the median of each statistic over the captured heads (a model's layers and heads
differ a lot: the record keeps every head). The fit minimizes the squared log-ratio of the twelve
statistics of the generator (``eval/synthetic.py``, at the capture's L and head_dim, medians over
the heads of several draws: ``--fit-seeds``, each draw a layer of ``--fit-heads`` heads, so the
knobs do not fit one draw's few heavy keys, topic regions and head scales) against the
target over the knobs ``KNOBS`` (strengths, counts and lengths; ``n_slash``, ``key_mean``,
``frac_horizontal``, ``n_topics`` stay at their defaults), with Nelder-Mead on the log of the
knobs (``n_heavy`` and ``topic_span`` rounded), from the defaults and, for the knobs that are off
by default (topics, drift), from ``START``. :func:`write_conf` writes the fitted knobs as a
``conf/data/`` file (the paper's shape: 32 query / 8 KV heads, head_dim 128, 128K; the strengths
are in logit units, so they carry over across head_dim, but the counts and lengths were fitted at
the capture's L).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

from .synthetic import SyntheticSpec, synthetic_qkv

LOCAL = 64
STATS = ("sink", "heavy", "local", "background_std", "row_spread", "keys90", "tile_keys90",
         "band_excess", "tile_share", "block_scatter", "tile_overlap", "head_spread")  # fmt: skip
TILE = 128  # query rows whose key mass is pooled for the tile statistics (a block_m tile)
BLOCK = 64  # key block of ``block_scatter`` (a block_n tile)
BAND = (96, 160)  # offsets of ``band_excess``: past the local band, inside a slow locality
FAR = 256  # ``band_excess``'s reference: the median logit of keys at least this far back
OVERLAP_TOP, OVERLAP_GAP = 40, 4  # ``tile_overlap``: top keys compared, tiles apart
KNOBS = ("sink", "heavy", "n_heavy", "slash", "background", "horizontal", "topics", "topic_frac",
         "topic_span", "drift", "drift_len", "head_temp")  # fmt: skip
OFF_UNLESS_SET = ("topic_balance",)  # written into the conf/data file only when a fit sets it
INT_KNOBS = ("n_heavy", "topic_span")  # fitted on a log scale, rounded
BOUNDS = {"sink": (0.5, 40.0), "heavy": (0.1, 30.0), "n_heavy": (1, 512), "slash": (0.1, 30.0),
          "background": (0.02, 8.0), "horizontal": (0.01, 8.0), "topics": (0.1, 30.0),
          "topic_frac": (0.005, 1.0), "topic_span": (16, 4096), "drift": (0.1, 30.0),
          "drift_len": (4.0, 2048.0), "head_temp": (0.01, 3.0)}  # fmt: skip
# Where the fit starts for the knobs that are off by default (the others start at their
# defaults): the band's logit excess on SmolLM2 is about +8 at offset 0, +4.7 at 64 and +2.6 at
# 256 (medians over heads), so drift ~6 over ~150 tokens; topics a few logits on a few % of keys.
START = {"topics": 4.0, "topic_frac": 0.05, "drift": 6.0, "drift_len": 150.0, "head_temp": 0.3}


@torch.no_grad()
def attention_stats(q: torch.Tensor, k: torch.Tensor, n_heavy: int = 16, row_step: int = 4):
    """The statistics ``STATS`` of one head, ``q [L, D]``, ``k [L, D]`` (post-RoPE), as floats."""
    L = q.shape[0]
    rows = torch.arange(L // 2, L, row_step)
    s = (q[rows].double() @ k.double().T) / math.sqrt(q.shape[-1])  # [R, L]
    cols = torch.arange(L)
    causal = cols[None, :] <= rows[:, None]
    s = s.masked_fill(~causal, float("-inf"))
    p = s.softmax(dim=-1)
    local = causal & (cols[None, :] > rows[:, None] - LOCAL)
    first = torch.zeros(L, dtype=torch.bool)
    first[1 : L // 2 - LOCAL] = True
    col_mass = p[:, first].mean(dim=0)
    heavy_cols = torch.nonzero(first).flatten()[col_mass.topk(n_heavy).indices]
    heavy = torch.zeros(L, dtype=torch.bool)
    heavy[heavy_cols] = True
    rest = causal & ~local & ~heavy[None, :]
    rest[:, 0] = False
    x = s.masked_fill(~rest, float("nan"))
    n = rest.sum(dim=-1)
    mean = torch.nanmean(x, dim=-1)
    std = torch.sqrt(torch.nanmean((x - mean[:, None]) ** 2, dim=-1))
    lme = torch.logsumexp(s.masked_fill(~rest, float("-inf")), dim=-1) - torch.log(n.double())
    return {
        "sink": float(p[:, 0].mean()),
        "heavy": float(p[:, heavy].sum(dim=-1).mean()),
        "local": float((p * local).sum(dim=-1).mean()),
        "background_std": float(std.mean()),
        "row_spread": float(lme.std()),
        "keys90": float(keys_for_mass(p, causal.sum(dim=-1)).median()),
        "tile_keys90": tile_keys_for_mass(p, rows),
        "band_excess": band_excess(s, rows),
        **tile_sharing(p, rows),
    }


def band_excess(s: torch.Tensor, rows: torch.Tensor) -> float:
    """Mean over rows of the mean logit at offsets ``BAND`` (``i - j``) minus the median logit of
    the keys at least ``FAR`` back (key 0 aside): how far a broad locality reaches past the last
    ``LOCAL`` keys (on SmolLM2 the excess decays over hundreds of tokens)."""
    r = torch.arange(len(rows))
    band = torch.stack([s[r, rows - d] for d in range(*BAND)], dim=-1).mean(dim=-1)
    cols = torch.arange(s.shape[1])
    far = (cols[None, :] <= rows[:, None] - FAR) & (cols[None, :] > 0)
    ref = torch.nanmedian(s.masked_fill(~far, float("nan")), dim=-1).values
    return float((band - ref).mean())


def tile_sharing(p: torch.Tensor, rows: torch.Tensor) -> dict:
    """How a tile's rows share their important *far* keys (before the tile's ``LOCAL`` band,
    key 0 aside), medians over tiles of ``TILE`` rows:

    * ``tile_share``: take the fewest far keys holding half of the tile's far mass (``n``); a
      row's far mass on them over its mass on its own ``n`` best far keys (1: every row's best
      keys are the tile's);
    * ``block_scatter``: how those ``n`` keys spread over key blocks of ``BLOCK``: 0 when they fill
      the fewest blocks possible (contiguous), 1 when they touch as many blocks as ``n`` random
      keys would on average;
    * ``tile_overlap``: the fraction of a tile's ``OVERLAP_TOP`` heaviest keys of the first half
      (key 0 aside) that are also among those of the tile ``OVERLAP_GAP`` tiles later (how long
      the rows' important keys persist)."""
    share, scatter, tops = [], [], []
    half = p.shape[1] // 2 - LOCAL
    for start in range(int(rows[0]), int(rows[-1]) + 1 - TILE + 1, TILE):
        sel = (rows >= start) & (rows < start + TILE)
        far = p[sel, 1 : start - LOCAL]
        mass = far.sum(dim=0)
        order = (mass / mass.sum()).sort(descending=True)
        n = int((order.values.cumsum(dim=0) < 0.5).sum()) + 1
        row = far / far.sum(dim=-1, keepdim=True)
        own = row.topk(n, dim=-1).values.sum(dim=-1)
        share.append(float((row[:, order.indices[:n]].sum(dim=-1) / own).median()))
        blocks = len(set(((order.indices[:n] + 1) // BLOCK).tolist()))
        total = math.ceil((start - LOCAL) / BLOCK)
        rand = total * (1 - (1 - 1 / total) ** n)
        least = math.ceil(n / BLOCK)
        scatter.append((blocks - least) / (rand - least) if rand - least > 1e-9 else 1.0)
        tops.append(set(p[sel, 1:half].sum(dim=0).topk(OVERLAP_TOP).indices.tolist()))
    overlap = [len(a & b) / OVERLAP_TOP for a, b in zip(tops, tops[OVERLAP_GAP:])]
    if not overlap:
        raise ValueError(
            f"L={p.shape[1]} is too short for tiles {OVERLAP_GAP} apart: use L >= "
            f"{2 * (OVERLAP_GAP + 2) * TILE}"
        )
    med = lambda x: float(torch.tensor(x).median())  # noqa: E731
    return {"tile_share": med(share), "block_scatter": med(scatter), "tile_overlap": med(overlap)}


def tile_keys_for_mass(p: torch.Tensor, rows: torch.Tensor, frac: float = 0.9) -> float:
    """Median over tiles of ``TILE`` consecutive query rows (the sampled ones) of the fraction of
    the keys before the tile (key 0 aside) that hold ``frac`` of the tile's mass on them: low
    when the rows of a tile share their important keys (stripes a tile-sparse method can keep),
    high when each row's strong keys sit elsewhere."""
    out = []
    for start in range(int(rows[0]), int(rows[-1]) + 1 - TILE + 1, TILE):
        sel = (rows >= start) & (rows < start + TILE)
        mass = p[sel, 1:start].sum(dim=0)  # the sink aside: it alone would hold 90% in many heads
        mass = mass / mass.sum()
        out.append(float(keys_for_mass(mass[None], torch.tensor([start - 1]), frac)[0]))
    if not out:
        raise ValueError(
            f"L={p.shape[1]} is too short for tiles of {TILE} rows: use L >= {4 * TILE}"
        )
    return float(torch.tensor(out).median())


def keys_for_mass(p: torch.Tensor, n: torch.Tensor, frac: float = 0.9) -> torch.Tensor:
    """Per row of ``p [R, L]``, the fraction of its ``n [R]`` causal keys that, taken by
    descending probability, hold ``frac`` of the row's mass (how concentrated the row is)."""
    cum = p.sort(dim=-1, descending=True).values.cumsum(dim=-1)
    return ((cum < frac).sum(dim=-1) + 1).double() / n.double()


def layer_stats(q: torch.Tensor, k: torch.Tensor, **kw) -> list[dict]:
    """Statistics of every query head of ``q [1, Hq, L, D]``, ``k [1, Hkv, L, D]``."""
    group = q.shape[1] // k.shape[1]
    return [attention_stats(q[0, h], k[0, h // group], **kw) for h in range(q.shape[1])]


def median_stats(per_head: list[dict]) -> dict:
    """Medians over heads of the per-head statistics, and ``head_spread``: the standard deviation
    of ``log keys90`` over the heads of a layer (median over layers): how unequally sharp the
    heads of one layer are."""
    out = {s: float(torch.tensor([h[s] for h in per_head]).median()) for s in STATS if s in
           per_head[0]}  # fmt: skip
    layers = sorted({h.get("layer", 0) for h in per_head})
    spread = [
        torch.tensor([math.log(h["keys90"]) for h in per_head if h.get("layer", 0) == layer])
        for layer in layers
    ]
    out["head_spread"] = float(torch.tensor([x.std(unbiased=False) for x in spread]).median())
    return out


def loss(stats: dict, target: dict) -> float:
    """Sum of squared log ratios (statistics below 0, ``band_excess`` can be, count as 0)."""
    eps = 1e-3
    return sum(
        math.log((max(stats[s], 0.0) + eps) / (max(target[s], 0.0) + eps)) ** 2 for s in STATS
    )


def synthetic_stats(knobs: dict, L: int, heads_q: int, heads_kv: int, head_dim: int,
                    seeds: tuple[int, ...] = (0,)) -> dict:  # fmt: skip
    """``median_stats`` of the generator with ``knobs`` over the heads of several draws: each
    seed's ``heads_q`` heads play the part of one captured layer's heads (the medians pool every
    head of every draw, ``head_spread`` is the median over draws), as the real target pools the
    heads of several layers. One seed gives that draw's statistics."""
    if not seeds:
        raise ValueError("seeds must name at least one draw of the generator")
    per_head = []
    for seed in seeds:
        spec = SyntheticSpec(L=L, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                             seed=seed, **knobs)  # fmt: skip
        q, k, _ = synthetic_qkv(spec)
        per_head += [{"layer": seed, **st} for st in layer_stats(q, k)]
    return median_stats(per_head)


def _clip(x: torch.Tensor) -> torch.Tensor:
    lo = torch.tensor([math.log(BOUNDS[k][0]) for k in KNOBS], dtype=torch.float64)
    hi = torch.tensor([math.log(BOUNDS[k][1]) for k in KNOBS], dtype=torch.float64)
    return torch.maximum(torch.minimum(x, hi), lo)


def nelder_mead(f, x0: torch.Tensor, step: float = 0.5, max_evals: int = 120, tol: float = 1e-4):
    """Minimize ``f`` from ``x0`` (a small, dependency-free Nelder-Mead); returns ``(x, fx)``."""
    n = x0.numel()
    simplex = [x0] + [x0 + step * torch.eye(n, dtype=x0.dtype)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = sorted(range(n + 1), key=lambda i: values[i])
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = torch.stack(simplex[:-1]).mean(dim=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        evals += 1
        if fr < values[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            evals += 1
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            evals += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
                evals += n
    best = min(range(len(values)), key=lambda i: values[i])
    return simplex[best], values[best]


def _knobs(x: torch.Tensor) -> dict:
    out = {}
    for k, v in zip(KNOBS, _clip(x).exp().tolist()):
        out[k] = int(round(v)) if k in INT_KNOBS else round(v, 4)
    return out


def fit(target: dict, L: int, heads: tuple[int, int], head_dim: int, max_evals: int,
        start: dict | None = None, seeds: tuple[int, ...] = (0,),
        fixed: dict | None = None):  # fmt: skip
    """``(knobs, fitted stats, trace)``: the generator's knobs whose statistics, pooled over the
    draws ``seeds`` (``synthetic_stats``), match ``target``, searched from ``start`` (default: the
    generator's defaults, ``START`` for the knobs that are off by default). Every evaluation uses
    the same seeds, so the objective is deterministic; more draws make it depend less on one
    draw's few random objects (heavy keys, topic regions, per-head scales) and cost time.
    ``fixed``: generator settings held fixed, not fitted (e.g. ``topic_balance``)."""
    trace = []
    fixed = fixed or {}

    def f(x: torch.Tensor) -> float:
        knobs = {**_knobs(x), **fixed}
        st = synthetic_stats(knobs, L, heads[0], heads[1], head_dim, seeds)
        value = loss(st, target)
        trace.append({"knobs": knobs, "loss": value})
        print(f"{len(trace):4d} loss {value:.4f} {knobs}", file=sys.stderr, flush=True)
        return value

    start = {**dataclasses.asdict(SyntheticSpec()), **START, **(start or {})}
    x0 = torch.tensor([math.log(start[k]) for k in KNOBS], dtype=torch.float64)
    x, _ = nelder_mead(f, _clip(x0), max_evals=max_evals)
    knobs = {**_knobs(x), **fixed}
    return knobs, synthetic_stats(knobs, L, heads[0], heads[1], head_dim, seeds), trace


def draw_losses(knobs: dict, target: dict, L: int, heads: tuple[int, int], head_dim: int,
                seeds: tuple[int, ...]) -> dict:  # fmt: skip
    """The loss of each single draw (seed) of the generator with ``knobs`` against ``target``:
    how much the fit's match depends on the draw (the calibration check runs single draws)."""
    return {
        str(s): loss(synthetic_stats(knobs, L, heads[0], heads[1], head_dim, (s,)), target)
        for s in seeds
    }


CONF_HEAD = """\
# Synthetic Q/K/V calibrated on real captured attention (eval/calibrate.py; made by
#   {command}
# at git {git}). The knobs {knobs} were fitted so that the generator's attention
# statistics (sink mass, heavy-hitter mass, local-band mass, background logit std, row spread, the
# keys holding 90% of a row's and of a 128-row tile's mass, the locality band's reach, and how a
# tile's rows share, scatter and keep their important keys; medians over heads) match those of
# {source}. Fit record: {record}.
# The shape below is the paper's (32 query / 8 KV heads, head_dim 128, 128K); the strengths are in
# logit units and were fitted at the capture's L={L} and head_dim={D}: at 128K the background has
# 32x more keys, and the counts and lengths (n_heavy, topic_frac, topic_span, drift_len) were
# fitted at L={L}, an extrapolation the fit itself does not check.
"""


def write_conf(path: Path, knobs: dict, meta: dict) -> None:
    base = dataclasses.asdict(SyntheticSpec())
    base.update(L=131072, heads_q=32, heads_kv=8, head_dim=128, **knobs)
    lines = ["source: synthetic"]
    for key, value in base.items():
        if key in OFF_UNLESS_SET and key not in knobs:
            continue  # a switch this fit left off: the file keeps conf/data/synthetic.yaml's keys
        lines.append(f"{key}: " + ("${seed}" if key == "seed" else json.dumps(value)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONF_HEAD.format(**meta) + "\n".join(lines) + "\n")


def real_stats(model: str, L: int, layers: list[int] | None) -> tuple[list[dict], dict, int]:
    from .data import model_input

    data, info = model_input(model, L, layers)
    per_head, D = [], None
    for layer, q, k, _ in data:
        D = q.shape[-1]
        for h, st in enumerate(layer_stats(q, k)):
            per_head.append({"layer": layer, "head": h, **st})
    info.pop("cache", None), info.pop("cache_hit", None)
    return per_head, info, D


if __name__ == "__main__":  # the command moved up a layer (it writes a record)
    raise SystemExit(
        "python -m eval.calibrate moved: run python -m experiments.calibration_fit with the same "
        "arguments (it writes the fit's record through experiments/records.py)"
    )
