"""Full (dense causal) attention through PyTorch SDPA with an explicit backend.

``flash`` is FlashAttention-2 (the paper's "Full"), ``cudnn`` the fastest dense kernel on Hopper,
``efficient`` the memory-efficient kernel, ``math`` the portable one (the CPU default).
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..stats import AttentionStats, dense_causal_tile_count
from ..validation import check_choice, check_positive_int
from .registry import Method, register

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def full_attention(q, k, v, *, backend: str = "auto", scale: float | None = None) -> torch.Tensor:
    """Dense causal attention; ``backend='auto'`` is ``flash`` on CUDA and ``math`` on CPU.

    K/V heads are repeated for GQA only on backends whose kernels do not take GQA natively.
    """
    if backend == "auto":
        backend = "flash" if q.device.type == "cuda" else "math"
    check_choice("backend", backend, tuple(BACKENDS))
    group = q.shape[1] // k.shape[1]
    if group > 1 and backend in ("cudnn", "efficient"):
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        group = 1
    with sdpa_kernel([BACKENDS[backend]]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=group > 1
        )


def _check(*, backend, block_m, block_n, scale):
    check_choice("backend", backend, ("auto", *BACKENDS))
    check_positive_int("block_m", block_m)
    check_positive_int("block_n", block_n)


def _attend(q, k, v, plan, *, backend, block_m, block_n, scale):
    out = full_attention(q, k, v, backend=backend, scale=scale)
    dense = dense_causal_tile_count(q.shape[2], block_m, block_n)
    tiles = torch.full(q.shape[:2], float(dense), dtype=torch.float64)
    return out, AttentionStats(tiles, dense, block_m, block_n)


FULL = register(
    Method(
        name="full",
        estimate=lambda q, k, v, **_: None,
        attend=_attend,
        defaults={"backend": "auto", "block_m": 128, "block_n": 128, "scale": None},
        check=_check,
    )
)
