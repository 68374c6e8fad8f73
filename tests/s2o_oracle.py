"""A deliberately dumb S2O oracle: Python loops per (batch, head, segment, query tile), float64.

No online softmax: a query's output is the exact softmax over the set of keys its tile accepted,
and each stop decision compares plain sums of ``exp`` (``gain >= tau * accumulated``). Only for
tiny shapes. Shared test inputs live here too.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

import torch


def structured_qkv(B, Hq, Hkv, L, D, *, seed=0, dtype=torch.float32, heavy=6, strength=4.0):
    """Random Q/K/V plus a shared direction that makes a sink and a few heavy-hitter keys.

    Queries lean towards the direction with a per-query weight (horizontal stripes); key 0 and
    ``heavy`` random keys carry it strongly (vertical stripes), so early stopping has work to skip.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g)
    k = torch.randn(B, Hkv, L, D, generator=g)
    v = torch.randn(B, Hkv, L, D, generator=g)
    u = torch.randn(B, Hkv, 1, D, generator=g)
    u = u / u.norm(dim=-1, keepdim=True) * math.sqrt(D)
    hot = torch.zeros(L)
    hot[0] = 1.0
    hot[torch.randint(0, L, (heavy,), generator=g)] = 1.0
    k = k + strength * hot[None, None, :, None] * u
    lean = torch.rand(B, Hq, L, 1, generator=g)
    q = q + strength * lean * u.repeat_interleave(Hq // Hkv, dim=1)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _orders(q, k, b, h, kvh, segs, local_window, causal=True):
    """Q_perm and KV_perm of one (batch, head) by sorting Python lists of float64 scores;
    non-causal: every key outside the window and the own segment is ranked."""
    s0, e0 = segs[0]
    k_guide = k[b, kvh, s0:e0].double().mean(dim=0)
    q_orders, kv_orders = [], []
    for s, e in segs:
        score_q = {i: float(q[b, h, i].double() @ k_guide) for i in range(s, e)}
        q_orders.append(sorted(range(s, e), key=lambda i: (-score_q[i], i)))
        q_mean = q[b, h, s:e].double().mean(dim=0)
        lo = max(0, s - local_window)
        keys = range(lo) if causal else [t for t in range(k.shape[2]) if not lo <= t < e]
        score_k = {t: float(k[b, kvh, t].double() @ q_mean) for t in keys}
        kv_orders.append(sorted(keys, key=lambda t: (-score_k[t], t)))
    return q_orders, kv_orders


def oracle_s2o(
    q, k, v, *, segment_len, tau, block_m, block_n, local_window=0, q_perm=True, stop_tile="keep",
    walk_budget=None, causal=True, topk_ratio=None,
):  # fmt: skip
    """Returns ``(out float64 [B,Hq,L,D], visited {(b, h): [tiles per query tile]}, orders)``.
    ``topk_ratio``: walk the first ceil(ratio x ranked tiles) tiles (the ratio as the decimal it
    prints as), no stop rule."""
    B, Hq, L, D = q.shape
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D)
    segs = [(s, min(s + segment_len, L)) for s in range(0, L, segment_len)]
    out = torch.zeros(B, Hq, L, D, dtype=torch.float64)
    visited, orders = {}, {}
    for b in range(B):
        for h in range(Hq):
            kvh = h // group
            logits = (q[b, h].double() @ k[b, kvh].double().T) * scale  # [L, L], tiny shapes only
            weights = torch.exp(logits - logits.max(dim=1, keepdim=True).values)
            q_orders, kv_orders = _orders(q, k, b, h, kvh, segs, local_window, causal)
            orders[(b, h)] = (q_orders, kv_orders)
            visited[(b, h)] = []
            for (s, e), q_order, kv_order in zip(segs, q_orders, kv_orders):
                rows_all = q_order if q_perm else list(range(s, e))
                lo = max(0, s - local_window)
                for a in range(0, e - s, block_m):
                    rows = rows_all[a : a + block_m]
                    accepted = {r: list(range(lo, r + 1 if causal else e)) for r in rows}
                    count = 0
                    budget = len(kv_order) if walk_budget is None else walk_budget * block_n
                    if topk_ratio is not None:
                        ranked_tiles = Decimal(-(-len(kv_order) // block_n))
                        share = Decimal(repr(topk_ratio)) * ranked_tiles
                        kept = int(share.to_integral_value(rounding=ROUND_CEILING))
                        budget = min(budget, kept * block_n)
                    for j in range(0, min(len(kv_order), budget), block_n):
                        tile = kv_order[j : j + block_n]
                        count += 1
                        gains = [
                            float(weights[r, tile].sum())
                            >= tau * float(weights[r, accepted[r]].sum())
                            for r in rows
                        ]
                        stop = tau > 0 and not any(gains)
                        if stop and stop_tile == "discard":
                            break
                        for r in rows:
                            accepted[r] += tile
                        if stop:
                            break
                    visited[(b, h)].append(count)
                    for r in rows:
                        w = weights[r, accepted[r]]
                        out[b, h, r] = (w / w.sum()) @ v[b, kvh, accepted[r]].double()
    return out, visited, orders
