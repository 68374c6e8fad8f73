"""Statistics shared by every attention method in the project.

Sparsity is always measured in query-key tiles against a dense *causal* tiled kernel that uses the
same tile sizes (see :func:`dense_causal_tile_count`), so dense attention has sparsity 0 and the
numbers of different methods are comparable. Non-causal attention counts against the dense
non-causal kernel (:func:`dense_tile_count` with ``causal=False``: every tile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dense_causal_tile_count(seq_len: int, block_m: int, block_n: int) -> int:
    """Tiles a dense causal FlashAttention-style kernel computes for one (batch, head).

    Query tile ``i`` covers rows ``[i*block_m, min((i+1)*block_m, L))``; it needs every key tile
    that holds a key at or before its last row (diagonal tiles included, fully masked ones skipped).
    """
    if seq_len <= 0:
        return 0
    total = 0
    for i in range(_cdiv(seq_len, block_m)):
        last_row = min((i + 1) * block_m, seq_len) - 1
        total += _cdiv(last_row + 1, block_n)
    return total


def dense_tile_count(seq_len: int, block_m: int, block_n: int, causal: bool = True) -> int:
    """Tiles a dense tiled kernel computes for one (batch, head): :func:`dense_causal_tile_count`,
    or every tile (``causal=False``)."""
    if causal:
        return dense_causal_tile_count(seq_len, block_m, block_n)
    return _cdiv(seq_len, block_m) * _cdiv(seq_len, block_n)


def s2o_ranked_len(
    seq_len: int, segment_start: int, segment_len: int, local_window: int, causal: bool = True
) -> int:
    """Keys segment ``[segment_start, ...)`` ranks and walks in Pass-2 (``P_n``): the causal
    prefix before the local window, or (non-causal) every key outside the window and the own
    segment."""
    lo = max(0, segment_start - local_window)
    if causal:
        return lo
    return seq_len - (min(segment_start + segment_len, seq_len) - lo)


def s2o_pass1_tile_count(
    seq_len: int,
    segment_len: int,
    local_window: int,
    block_m: int,
    block_n: int,
    causal: bool = True,
) -> int:
    """Tiles S2O's Pass-1 computes per head: local-window tiles + in-segment tiles (causal, or
    the whole segment)."""
    total = 0
    for s in range(0, seq_len, segment_len):
        e = min(s + segment_len, seq_len)
        window = min(local_window, s)
        for a in range(s, e, block_m):
            last_row = min(a + block_m, e) - 1 if causal else e - 1
            total += _cdiv(window, block_n) + _cdiv(last_row + 1 - s, block_n)
    return total


def check_topk_ratio(topk_ratio) -> float | None:
    """``None``, or a real number in ``(0, 1]`` returned as a float; anything else is refused,
    naming the value."""
    if topk_ratio is None:
        return None
    ok = isinstance(topk_ratio, (int, float)) and not isinstance(topk_ratio, bool)
    if not ok or not 0.0 < float(topk_ratio) <= 1.0:
        raise ValueError(f"topk_ratio must be None or a number in (0, 1], got {topk_ratio!r}")
    return float(topk_ratio)


def refuse_topk_with_early_stop(topk_ratio, tau) -> None:
    """The top-k mode walks a fixed share of each ranked prefix with no early stop, so it is
    refused with ``tau > 0``, naming both values (the one refusal of the method, the reference
    and the kernels)."""
    if topk_ratio is not None and tau > 0:
        raise ValueError(
            f"topk_ratio={topk_ratio!r} walks a fixed share of the ranked prefix without early "
            f"stop: tau must be <= 0, got tau={tau!r}; set tau <= 0 (got tau={tau!r}) or "
            "topk_ratio=None"
        )


def topk_walk_tiles(ranked_tiles: int, topk_ratio: float) -> int:
    """Key tiles S2O's top-k mode walks of a ranked prefix of ``ranked_tiles`` tiles:
    ``ceil(topk_ratio * ranked_tiles)``, with the ratio read as the shortest decimal that prints
    it (``0.07`` of 100 tiles is 7, not the 8 that ``math.ceil`` of the binary float product
    gives). At least one tile of a non-empty prefix, never more than all of it."""
    ratio = Fraction(repr(check_topk_ratio(topk_ratio)))
    return _cdiv(ratio.numerator * ranked_tiles, ratio.denominator)


def s2o_walk_tiles(
    seq_len: int,
    segment_start: int,
    segment_len: int,
    local_window: int,
    block_n: int,
    walk_budget: int | None = None,
    topk_ratio: float | None = None,
    causal: bool = True,
) -> int:
    """Most key tiles a Pass-2 query tile of segment ``[segment_start, ...)`` walks: its ranked
    prefix ``ceil(P_n / block_n)``, cut to :func:`topk_walk_tiles` (``topk_ratio``) and to
    ``walk_budget``, whichever are given. The walk covers the first ``min(P_n, tiles *
    block_n)`` ranked keys."""
    ranked = _cdiv(s2o_ranked_len(seq_len, segment_start, segment_len, local_window, causal),
                   block_n)  # fmt: skip
    tiles = ranked if topk_ratio is None else topk_walk_tiles(ranked, topk_ratio)
    return tiles if walk_budget is None else min(tiles, walk_budget)


def s2o_pass2_tile_max(
    seq_len: int,
    segment_len: int,
    local_window: int,
    block_m: int,
    block_n: int,
    walk_budget: int | None = None,
    causal: bool = True,
    topk_ratio: float | None = None,
) -> list[int]:
    """Most key tiles each Pass-2 query tile can visit (:func:`s2o_walk_tiles`), for every query
    tile in segment order. In the top-k mode (``topk_ratio``, no early stop) every query tile
    visits exactly this many."""
    out = []
    for s in range(0, seq_len, segment_len):
        e = min(s + segment_len, seq_len)
        tiles = s2o_walk_tiles(seq_len, s, segment_len, local_window, block_n, walk_budget,
                               topk_ratio, causal)  # fmt: skip
        out += [tiles] * _cdiv(e - s, block_m)
    return out


@dataclass
class AttentionStats:
    """What a sparse-attention call did, in the project-wide units.

    Attributes:
        tiles_processed: ``[B, Hq]`` float tensor, query-key tiles computed per (batch, head).
        tiles_dense: tiles a dense causal kernel with the same tile sizes computes per head.
        block_m, block_n: the tile sizes the counts refer to.
        extra: method-specific tensors and numbers (for S2O: ``pass2_tiles`` and friends).
        time_estimate_ms, time_attention_ms: filled only when timing is asked for.
    """

    tiles_processed: torch.Tensor
    tiles_dense: int
    block_m: int
    block_n: int
    extra: dict = field(default_factory=dict)
    time_estimate_ms: float | None = None
    time_attention_ms: float | None = None

    @property
    def density_per_head(self) -> torch.Tensor:
        """``[B, Hq]``: processed tiles / dense causal tiles."""
        return self.tiles_processed.double() / max(self.tiles_dense, 1)

    @property
    def sparsity_per_head(self) -> torch.Tensor:
        """``[B, Hq]``: 1 - density."""
        return 1.0 - self.density_per_head

    @property
    def density(self) -> float:
        return float(self.density_per_head.mean())

    @property
    def sparsity(self) -> float:
        """Mean sparsity over batch and heads, a Python float."""
        return float(self.sparsity_per_head.mean())

    def summary(self) -> dict:
        """Plain-Python numbers, ready for a results record."""
        out = {
            "sparsity": self.sparsity,
            "density": self.density,
            "tiles_dense_per_head": self.tiles_dense,
            "block_m": self.block_m,
            "block_n": self.block_n,
        }
        if self.time_estimate_ms is not None:
            out["time_estimate_ms"] = self.time_estimate_ms
        if self.time_attention_ms is not None:
            out["time_attention_ms"] = self.time_attention_ms
        return out


def s2o_stats(
    pass2_tiles: torch.Tensor,
    seq_len: int,
    segment_len: int,
    local_window: int,
    block_m: int,
    block_n: int,
    walk_budget: int | None,
    causal: bool = True,
    topk_ratio: float | None = None,
) -> AttentionStats:
    """S2O's :class:`AttentionStats` from the Pass-2 visits ``[B, Hq, n_query_tiles]`` (the
    reference and the kernels count the same way): Pass-1 tiles plus the visits, and in ``extra``
    ``pass2_tiles``, ``pass2_tiles_max`` ``[n_query_tiles]``, ``pass1_tiles``, ``causal`` and
    ``topk_ratio``."""
    geometry = (seq_len, segment_len, local_window, block_m, block_n)
    pass1 = s2o_pass1_tile_count(*geometry, causal=causal)
    pass2 = pass2_tiles.long()
    return AttentionStats(
        tiles_processed=(pass2.sum(dim=-1) + pass1).double(),
        tiles_dense=dense_tile_count(seq_len, block_m, block_n, causal),
        block_m=block_m,
        block_n=block_n,
        extra={
            "pass2_tiles": pass2,
            "pass2_tiles_max": torch.tensor(
                s2o_pass2_tile_max(*geometry, walk_budget, causal, topk_ratio), dtype=torch.long
            ),
            "pass1_tiles": pass1,
            "causal": bool(causal),
            "topk_ratio": topk_ratio,
        },
    )
