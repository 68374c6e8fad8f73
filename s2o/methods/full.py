"""Full (dense causal) attention through PyTorch SDPA with an explicit backend.

``flash`` is FlashAttention-2 (the paper's "Full"), ``cudnn`` the fastest dense kernel on Hopper,
``efficient`` the memory-efficient kernel, ``math`` the portable one (the CPU default).
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..stats import AttentionStats, dense_causal_tile_count
from ..validation import check_choice, check_scale, check_tile
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
    check_backend_usable(backend, q, k, v)
    group = q.shape[1] // k.shape[1]
    if group > 1 and backend in ("cudnn", "efficient"):
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        group = 1
    try:
        with sdpa_kernel([BACKENDS[backend]]):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale, enable_gqa=group > 1
            )
    except RuntimeError as exc:
        if "No available kernel" not in str(exc) and "No viable backend" not in str(exc):
            raise
        raise ValueError(
            f"full backend={backend!r} has no kernel for these inputs (device {q.device}, dtype "
            f"{q.dtype}, q shape {tuple(q.shape)}, last-dim strides {_strides(q, k, v)}): "
            "use backend='auto' or 'math'"
        ) from exc


def _strides(q, k, v) -> dict:
    return {name: t.stride(-1) for name, t in (("q", q), ("k", k), ("v", v))}


def check_backend_usable(backend: str, q, k, v) -> None:
    """The cases PyTorch reports only as "No available kernel", named with knob and cause."""
    if backend in ("cudnn", "efficient") and q.device.type != "cuda":
        raise ValueError(
            f"full backend={backend!r} needs CUDA tensors, got device {q.device}: "
            "use backend='auto' (math on the CPU) or 'math'"
        )
    if backend != "math" and any(s != 1 for s in _strides(q, k, v).values()):
        raise ValueError(
            f"full backend={backend!r} needs a contiguous last dimension (stride 1), got "
            f"last-dim strides {_strides(q, k, v)}: pass .contiguous() tensors or use "
            "backend='math'"
        )


def _check(*, backend, block_m, block_n, scale):
    check_choice("backend", backend, ("auto", *BACKENDS))
    check_tile("block_m", block_m)
    check_tile("block_n", block_n)
    check_scale(scale)


def _causal_rows(stats: AttentionStats, rows: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Dense causal attention computes every key at or before each row."""
    B, Hq = stats.tiles_processed.shape
    keys = torch.arange(seq_len, device=rows.device)
    return (keys[None, :] <= rows[:, None]).expand(B, Hq, -1, -1)


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
        coverage=lambda plan, stats, rows, seq_len, **_: _causal_rows(stats, rows, seq_len),
    )
)
