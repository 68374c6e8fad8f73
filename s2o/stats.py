"""Statistics shared by every attention method in the project.

Sparsity is always measured in query-key tiles against a dense *causal* tiled kernel that uses the
same tile sizes (see :func:`dense_causal_tile_count`), so dense attention has sparsity 0 and the
numbers of different methods are comparable. Non-causal attention counts against the dense
non-causal kernel (:func:`dense_tile_count` with ``causal=False``: every tile).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def s2o_pass2_tile_max(
    seq_len: int,
    segment_len: int,
    local_window: int,
    block_m: int,
    block_n: int,
    walk_budget: int | None = None,
    causal: bool = True,
) -> list[int]:
    """Most key tiles each Pass-2 query tile can visit, ``ceil(P_n / block_n)`` capped at
    ``walk_budget``, for every query tile in segment order."""
    out = []
    for s in range(0, seq_len, segment_len):
        e = min(s + segment_len, seq_len)
        tiles = _cdiv(s2o_ranked_len(seq_len, s, segment_len, local_window, causal), block_n)
        tiles = tiles if walk_budget is None else min(tiles, walk_budget)
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
) -> AttentionStats:
    """S2O's :class:`AttentionStats` from the Pass-2 visits ``[B, Hq, n_query_tiles]`` (the
    reference and the kernels count the same way): Pass-1 tiles plus the visits, and in ``extra``
    ``pass2_tiles``, ``pass2_tiles_max`` ``[n_query_tiles]``, ``pass1_tiles`` and ``causal``."""
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
                s2o_pass2_tile_max(*geometry, walk_budget, causal), dtype=torch.long
            ),
            "pass1_tiles": pass1,
            "causal": bool(causal),
        },
    )
