"""Input checks shared by every public entry point; each error names the offending value."""

from __future__ import annotations

import math
import os

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
IMPLS = ("auto", "reference", "triton")


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
    if q.device.type == "meta":
        raise ValueError(
            "q, k and v are on the 'meta' device (shapes without data): the methods compute on "
            "values; move them to 'cpu' or 'cuda' first"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if 0 in t.shape:
            raise ValueError(f"empty input: {name} has shape {tuple(t.shape)} (a zero dimension)")
    if hq % hk != 0:
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


def check_inference_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Refuse what would give a silently wrong answer: a gradient request and non-finite values.

    The methods are inference-only (no backward pass). A NaN or Inf in an input is refused rather
    than propagated: the sparse methods would turn the affected rows into zeros or skip them
    depending on which tiles they select, so no method could be compared against dense attention
    there. The common case costs one reduction per tensor; the position is found only on failure.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name} requires grad, but the attention methods are inference-only (no backward "
                "pass): call them under torch.no_grad() or torch.inference_mode(), or pass "
                f"{name}.detach()"
            )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not torch.isfinite(t.sum(dtype=torch.float32)):
            bad = ~torch.isfinite(t)
            if bad.any():
                pos = tuple(int(i) for i in bad.nonzero()[0])
                raise ValueError(
                    f"{name} has a non-finite value ({t[pos].item()}) at [b, h, l, d] = "
                    f"{list(pos)} ({int(bad.sum())} non-finite in all): the methods refuse "
                    "NaN/Inf inputs (sparse selection would hide or zero them); clean the input"
                )


def _triton_usable(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def resolve_impl(impl: str, device: torch.device) -> str:
    """``auto`` -> Triton for CUDA tensors, reference otherwise; an explicit choice is checked."""
    check_choice("impl", impl, IMPLS)
    if impl == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if impl == "triton" and not _triton_usable(device):
        raise ValueError(
            f"impl='triton' needs CUDA tensors (got device {device}); set TRITON_INTERPRET=1 "
            "to run the kernels on the CPU interpreter, or use impl='reference'"
        )
    return impl


def check_interpreter_dtype(impl: str, t: torch.Tensor) -> None:
    """bf16 on the Triton CPU interpreter is refused: its bf16 ``tl.dot`` is wrong (errors ~1e8)."""
    if impl == "triton" and t.device.type == "cpu" and t.dtype == torch.bfloat16:
        raise ValueError(
            "bfloat16 with impl='triton' on the CPU (the Triton interpreter, TRITON_INTERPRET=1) "
            "is refused: the interpreter's bf16 tl.dot gives wrong results (errors of order 1e8). "
            "Use float16 or float32 on the CPU, impl='reference', or a CUDA GPU for bf16"
        )


def check_power_of_two(name: str, value: object) -> int:
    """Tile sizes: the Triton kernels build ``tl.arange(0, size)``, which needs a power of two."""
    check_positive_int(name, value)
    if value & (value - 1):  # type: ignore[operator]
        raise ValueError(f"{name}={value} must be a power of two (a Triton tile size)")
    return value  # type: ignore[return-value]


# Largest tile edge: Triton refuses blocks of more than 2**20 elements, and a block_m x block_n
# score tile reaches that at 1024 x 1024 (the methods use 16 to 256).
MAX_TILE = 1024


def check_tile(name: str, value: object) -> int:
    """A tile size (``block_m``, ``block_n``, ``block_size``): a power of two <= :data:`MAX_TILE`
    (the Triton kernels also need >= 16; the reference takes smaller tiles)."""
    check_power_of_two(name, value)
    if value > MAX_TILE:  # type: ignore[operator]
        raise ValueError(
            f"{name}={value} is larger than the largest tile size, {MAX_TILE} (the methods use "
            "16 to 256)"
        )
    return value  # type: ignore[return-value]


def check_scale(scale: object) -> float | None:
    """The softmax scale of every method: ``None`` (``1/sqrt(D)``) or a finite number > 0."""
    if scale is None:
        return None
    value = check_finite("scale", scale)
    if value <= 0:
        raise ValueError(f"scale must be a finite number > 0 or None, got {scale!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value
