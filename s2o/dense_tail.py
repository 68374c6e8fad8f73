"""``dense_tail``: a named S2O variant (not in the paper) in which the last query rows attend to
their whole causal prefix.

Why: in a retrieval prompt the question is the last few dozen tokens of a 2048-token segment.
Step 1 ranks the segment's prefix by its *mean* query, which the haystack's queries dominate, so
the keys the question needs may sit late in the ranked order, and the early stop of the tile
that holds the question ends the walk before them (the retrieval diagnosis,
``analysis/retrieval_diagnosis.md``). ``dense_tail = T`` (tokens, default 0: the paper's method)
changes two things and nothing else:

* **Step 1.** In every segment the rows at positions ``>= L - T`` leave ``Q_perm``'s order: the
  segment's other rows keep their ranked order and the tail rows follow them in original order,
  so the tail occupies walk slots ``[L - T, L)`` exactly (with ``q_perm`` off it already does).
* **Pass-2.** A query tile whose walk slots include one of ``[L - T, L)`` never stops: it walks
  its segment's whole ranked prefix (as ``tau = 0`` would). Every other tile runs the stop rule.

The tail tiles' visits are counted like any other, so the density includes their cost. The
ranked prefix excludes the local window and the own segment, which Pass-1 computes densely
anyway, so a tail row attends to every key at or before it: exact dense attention for those rows.
Refused with ``topk_ratio`` and ``walk_budget`` (a capped walk is not a whole prefix) and with
``causal=False`` (no "tail" in a non-causal prefill).
"""

from __future__ import annotations

import torch


def check_dense_tail(dense_tail, *, topk_ratio=None, walk_budget=None, causal=True) -> int:
    """``dense_tail`` as an int >= 0; a bad value or combination raises ``ValueError`` naming it."""
    if isinstance(dense_tail, bool) or not isinstance(dense_tail, int) or dense_tail < 0:
        raise ValueError(f"dense_tail must be an int >= 0 (query rows), got {dense_tail!r}")
    if dense_tail:
        clash = {
            "topk_ratio": topk_ratio, "walk_budget": walk_budget,
            "causal": None if causal else False,
        }  # fmt: skip
        set_ = {k: v for k, v in clash.items() if v is not None}
        if set_:
            name, value = next(iter(set_.items()))
            raise ValueError(
                f"dense_tail={dense_tail} walks the last rows' whole causal prefix; it cannot be "
                f"combined with {name}={value!r} (set dense_tail=0 or drop {name})"
            )
    return dense_tail


def tail_start(seq_len: int, dense_tail: int) -> int:
    """First position (and walk slot) of the dense tail: ``L - T`` clipped to ``[0, L]``."""
    return max(0, seq_len - dense_tail)


def tail_last(q_perm: torch.Tensor, segment_len: int, dense_tail: int) -> torch.Tensor:
    """``q_perm`` ``[B, Hq, L]`` with, in every segment, the rows at positions ``>= L - T`` moved
    after the segment's other rows (those keep their order; the tail goes in original order).
    Returns ``q_perm`` itself when ``dense_tail`` is 0 or nothing moves."""
    L = q_perm.shape[-1]
    start = tail_start(L, dense_tail)
    if start >= L:
        return q_perm
    out = q_perm.clone()
    seg0 = (start // segment_len) * segment_len
    for s in range(seg0, L, segment_len):
        e = min(s + segment_len, L)
        rows = q_perm[..., s:e]
        is_tail = rows >= start
        slot = torch.arange(e - s, device=q_perm.device).expand_as(rows)
        # rows before the tail keep their slot order; tail rows follow, in position order
        key = torch.where(is_tail, L + rows, slot)
        out[..., s:e] = torch.gather(rows, -1, key.argsort(dim=-1))
    return out


def forced_tiles(seg_start: int, rows: int, block_m: int, seq_len: int, dense_tail: int):
    """Indices (within a segment of ``rows`` walk slots starting at ``seg_start``) of the Pass-2
    query tiles that hold a tail slot and therefore never stop: ``range(first, n_tiles)``."""
    start = tail_start(seq_len, dense_tail)
    n_tiles = -(-rows // block_m)
    if start >= seg_start + rows:
        return range(n_tiles, n_tiles)
    return range(max(0, start - seg_start) // block_m, n_tiles)
