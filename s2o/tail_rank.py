"""``tail_rank``: a named S2O variant (not in the paper) in which the last query rows walk a
ranking of their own, with the normal early stop.

Why: in a retrieval prompt the question is the last few dozen tokens of a 2048-token segment.
Step 1 ranks the segment's prefix by its *mean* query, which the haystack's queries dominate, so
the needle the question reads may sit late in that order (Qwen2.5-Coder-1.5B, the heads that read
the needle: a median rank share of .32-.36 in the segment-mean order, .006-.1 in the question
rows' own mean-query order; ``results/figures/retrieval_diagnosis.md``), and the early stop of
the question's tile ends the walk before it. :mod:`s2o.dense_tail` fixes that by walking the
whole prefix for those tiles; ``tail_rank = T`` (rows, default 0: the paper's method) keeps the
stop rule and fixes the order instead. It changes two things and nothing else:

* **Step 1.** As ``dense_tail``: in every segment the rows at positions ``>= L - T`` leave
  ``Q_perm``'s order and follow the segment's other rows in original order, so the tail occupies
  walk slots ``[L - T, L)`` (:func:`s2o.dense_tail.tail_last`). In addition, every segment ``n``
  that holds tail rows gets a second ranked row: its ranked prefix (``t < P_n``, the same keys
  its segment ranks) in descending ``<mean of the tail rows of segment n, k_t>`` order, stable,
  fp32, ``-1`` padded. These rows are appended to ``kv_perm``: ``kv_perm [B, Hq, N + N_tail,
  P_max]``, row ``N + n - n0`` for segment ``n >= n0 = (L - T) // S`` (:func:`tail_rows`). The
  segment's own row, and its mean query, are unchanged.
* **Pass-2.** A query tile whose walk slots include one of ``[L - T, L)`` walks its segment's
  tail row instead of the segment's row, with the normal stop rule (``tau``), the same walk
  length cap (``P_n``, ``walk_budget``, ``topk_ratio``) and the same visit counting. Every other
  tile is untouched. A tile that mixes tail and non-tail slots (``L - T`` not a multiple of
  ``block_m`` inside the segment) walks the tail row for all its rows.

What it costs: Step 1 ranks ``N_tail`` more rows (one when the tail fits in the last segment:
one fp32 product over the prefix and one sort per head); Pass-2 does the same work per tile as
the default (its density counts every visited tile, the tail's included), so the tail's walk can
be as short as any other tile's where the dense tail walks everything.

Not the paper's method: the paper ranks each segment by its mean query only. Refused with
``dense_tail`` (both decide the tail tiles' walk) and with ``causal=False`` (no "tail" in a
non-causal prefill). Allowed with ``walk_budget`` and ``topk_ratio``: they cap the tail tiles'
walk of their own ranking exactly as they cap every other tile's walk.

Why a module of its own and not one ``tail.py`` with ``dense_tail``: the two variants share only
the slot layout (:func:`~s2o.dense_tail.tail_last`, :func:`~s2o.dense_tail.tail_start`,
:func:`~s2o.dense_tail.forced_tiles`, imported from there), and each keeps its contract in its
own docstring; ``s2o.dense_tail`` stays as committed.
"""

from __future__ import annotations

import torch

from .dense_tail import forced_tiles, tail_last, tail_start

__all__ = ["check_tail_rank", "tail_rows", "tail_tiles", "tail_last", "tail_start", "kv_rows"]


def check_tail_rank(tail_rank, *, dense_tail=0, causal=True) -> int:
    """``tail_rank`` as an int >= 0; a bad value or combination raises ``ValueError`` naming it."""
    if isinstance(tail_rank, bool) or not isinstance(tail_rank, int) or tail_rank < 0:
        raise ValueError(f"tail_rank must be an int >= 0 (query rows), got {tail_rank!r}")
    if tail_rank and dense_tail:
        raise ValueError(
            f"tail_rank={tail_rank} ranks the last rows' prefix on their own and walks it with "
            f"the stop rule; dense_tail={dense_tail!r} walks it all: pick one (set the other to 0)"
        )
    if tail_rank and not causal:
        raise ValueError(
            f"tail_rank={tail_rank} ranks the causal prefix of the last rows; it cannot be "
            "combined with causal=False (no tail in a non-causal prefill; set tail_rank=0)"
        )
    return tail_rank


def tail_rows(seq_len: int, segment_len: int, tail_rank: int) -> tuple[int, int]:
    """``(n0, N_tail)``: the first segment holding a tail row and how many do (``(N, 0)`` when
    ``tail_rank`` is 0). Segment ``n >= n0``'s own ranking is ``kv_perm`` row ``N + n - n0``,
    i.e. ``n + N_tail``."""
    n_seg = -(-seq_len // segment_len)
    if tail_rank == 0 or seq_len == 0:
        return n_seg, 0
    n0 = tail_start(seq_len, tail_rank) // segment_len
    return n0, n_seg - n0


def tail_tiles(seg_start: int, rows: int, block_m: int, seq_len: int, tail_rank: int) -> range:
    """Indices (within a segment of ``rows`` walk slots from ``seg_start``) of the query tiles
    that hold a tail slot and walk the tail's own ranking: ``range(first, n_tiles)``."""
    return forced_tiles(seg_start, rows, block_m, seq_len, tail_rank)


def kv_rows(slot: torch.Tensor, seq_len: int, segment_len: int, block_m: int,
            tail_rank: int) -> torch.Tensor:  # fmt: skip
    """The ``kv_perm`` row each walk slot's query tile walks (same shape as ``slot``, absolute walk
    slots): its segment's, or the segment's tail row where the tile holds a tail slot."""
    seg = slot // segment_len
    if tail_rank == 0:
        return seg
    start = tail_start(seq_len, tail_rank)
    n_tail = tail_rows(seq_len, segment_len, tail_rank)[1]
    seg_start = seg * segment_len
    tile_first = seg_start + (slot - seg_start) // block_m * block_m
    last = torch.minimum(tile_first + block_m, (seg_start + segment_len).clamp_max(seq_len))
    return torch.where(last > start, seg + n_tail, seg)
