"""Launch settings of the attention kernels, passed as arguments (no module state).

A :class:`Launch` names ``num_warps``, ``num_stages`` and ``sub_n`` for one kernel; a field left
``None`` takes the default for the head size and GPU from :func:`resolve_launch`. ``sub_n`` is the
number of key rows per matrix product inside a logical ``block_n`` key tile: the tile sizes that
the stop rule and the statistics count (``block_m x block_n``) do not change with it; smaller
sub-tiles only bound the registers and shared memory a program needs (head_dim 256).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

KERNELS = ("pass1", "pass2", "fused", "block_sparse")
WALKS = ("triton", "gluon")  # Pass-2's ranked walk (Launch.walk)
# head sizes the kernels take: powers of two, the MMA's K dimension (>= 16) up to 256
HEAD_DIMS = (16, 32, 64, 128, 256)
# Pass-2 at head_dim 128 with 5 stages keeps more gathered K/V tiles in flight: faster than 3
# stages at every tau on an H200 at 128K, the same output (the retired probe
# benchmarks/stages_probe.py; no record of it was committed). It needs Hopper-class shared memory.
_PASS2_DEEP_STAGES, _DEEP_SMEM_BYTES = 5, 227 * 1024
# head_dim 256: 128 x 128 x 256 K and V tiles (64 KiB each) at 3 stages exceed the shared memory
# of an H100/H200 (Triton OutOfResources); key sub-tiles of 64 rows and 2 stages fit
_D256_SUB_N = 64


@dataclass(frozen=True)
class Launch:
    """Launch settings of one kernel; ``None`` fields take :func:`resolve_launch`'s default.
    ``walk`` (Pass-2 only): the ranked walk, ``"triton"`` or ``"gluon"``
    (:mod:`s2o.kernels.gluon_walk`, Hopper); ``None``: Gluon where its scope takes the call."""

    num_warps: int | None = None
    num_stages: int | None = None
    sub_n: int | None = None
    walk: str | None = None


def check_head_dim(head_dim: int) -> None:
    """Refuse a head size the Triton kernels do not take, naming it."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(
            f"the Triton kernels take head_dim in {HEAD_DIMS}, got {head_dim} "
            "(use impl='reference' for other head sizes)"
        )


@functools.cache
def _smem_per_block(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0))


def _default(kernel: str, head_d: int, block_n: int, device: torch.device, gather: bool) -> Launch:
    if device.type != "cuda":
        return Launch(sub_n=_D256_SUB_N if head_d >= 256 else None)
    if head_d >= 256:
        return Launch(num_warps=8, num_stages=2, sub_n=_D256_SUB_N)
    if kernel == "block_sparse":  # square block_n tiles (results/baselines)
        if block_n >= 64:
            return Launch(num_warps=8 if block_n >= 128 and head_d >= 128 else 4, num_stages=3)
        return Launch(num_warps=4, num_stages=2)
    stages = 3 if head_d >= 128 else 2
    # only the gathered walk: contiguous K/V tiles (gather=False, the ABCD baseline) are staged in
    # shared memory and need 352 KB at 5 stages (H200 limit: 227 KB)
    deep = gather and _smem_per_block(device) >= _DEEP_SMEM_BYTES
    if kernel == "pass2" and head_d >= 128 and deep:
        stages = _PASS2_DEEP_STAGES
    return Launch(num_warps=8 if head_d >= 128 else 4, num_stages=stages)


def resolve_launch(
    kernel: str,
    launch: Launch | None,
    *,
    head_d: int,
    block_n: int,
    device: torch.device,
    gather: bool = True,
) -> tuple[int, dict]:
    """``(sub_n, triton launch kwargs)`` for ``kernel``: the given fields, the defaults for the
    rest. ``sub_n`` must be a power of two >= 16 dividing ``block_n`` (named otherwise)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    given = launch or Launch()
    if not isinstance(given, Launch):
        raise ValueError(f"launch settings of {kernel} must be a Launch, got {given!r}")
    if given.walk is not None and (kernel != "pass2" or given.walk not in WALKS):
        raise ValueError(f"{kernel}: walk={given.walk!r} is a Pass-2 setting, one of {WALKS}")
    d = _default(kernel, head_d, block_n, device, gather)
    got = replace(d, **{k: v for k, v in vars(given).items() if v is not None})
    # a default sub-tile never exceeds the tile; a given one must divide it
    sub_n = given.sub_n if given.sub_n is not None else min(d.sub_n or block_n, block_n)
    if sub_n < 16 or sub_n & (sub_n - 1) or block_n % sub_n:
        raise ValueError(
            f"{kernel}: sub_n={sub_n} must be a power of two >= 16 dividing block_n={block_n}"
        )
    kw = {}
    if got.num_warps is not None:
        kw["num_warps"] = got.num_warps
    if got.num_stages is not None:
        kw["num_stages"] = got.num_stages
    return sub_n, kw
