"""S2O: early stopping for sparse attention via online permutation."""

from .api import s2o_attention
from .methods import METHODS, sparse_attention
from .stats import AttentionStats, dense_causal_tile_count

__all__ = [
    "METHODS",
    "AttentionStats",
    "dense_causal_tile_count",
    "s2o_attention",
    "sparse_attention",
]
__version__ = "0.1.0"
