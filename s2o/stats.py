"""Statistics shared by every attention method in the project.

Sparsity is always measured in query-key tiles against a dense *causal* tiled kernel that uses the
same tile sizes (see :func:`dense_causal_tile_count`), so dense attention has sparsity 0 and the
numbers of different methods are comparable.
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
