"""Input checks shared by every public entry point; each error names the offending value."""

from __future__ import annotations

import math

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Validate the ``[B, H, L, D]`` causal-prefill layout with GQA; raise ``ValueError``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have rank 4 [B, H, L, D], got shape {tuple(t.shape)} (rank {t.dim()})"
            )
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {list(SUPPORTED_DTYPES)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"dtype mismatch: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"device mismatch: q {q.device}, k {k.device}, v {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: k {tuple(k.shape)}, v {tuple(v.shape)}")
    bq, hq, lq, dq = q.shape
    bk, hk, lk, dk = k.shape
    if bq != bk:
        raise ValueError(f"batch sizes differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if lq != lk:
        raise ValueError(
            f"causal prefill needs equal lengths: q has L={lq}, k has L={lk} "
            f"(shapes q {tuple(q.shape)}, k {tuple(k.shape)})"
        )
    if dq != dk:
        raise ValueError(f"head dims differ: q has D={dq}, k has D={dk}")
    if lq == 0 or dq == 0 or bq == 0:
        raise ValueError(f"empty input: q shape {tuple(q.shape)}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hk} (GQA)")


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")
    return value  # type: ignore[return-value]
