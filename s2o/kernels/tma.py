"""TMA tensor descriptors for the contiguous K/V tiles of the attention kernels.

On Hopper-class GPUs (compute capability >= 9) the kernels load tiles of consecutive key rows
(S2O's Pass-1 and the fused kernel's dense part, the block-sparse kernel without a permutation)
through 4-D descriptors over ``[B, Hkv, L, D]``; rows past ``L`` come back as zeros. Gathered rows
(S2O's ranked walk) and the permuted block-sparse kernel (PBS) keep pointer loads. Both paths
compute the same tiles. Launchers take ``descriptors``: ``None`` (automatic), True or False.
"""

from __future__ import annotations

import torch


def use_descriptors(k: torch.Tensor, v: torch.Tensor, descriptors: bool | None = None) -> bool:
    """Whether the kernels load contiguous K/V tiles through descriptors: ``descriptors`` when
    given, else on CUDA devices of capability >= 9 whose K and V have 16-byte aligned base
    addresses and strides (the TMA requirement)."""
    if descriptors not in (None, True, False):
        raise ValueError(f"descriptors must be None, True or False, got {descriptors!r}")
    if descriptors is not None:
        return descriptors
    if k.device.type != "cuda" or torch.cuda.get_device_capability(k.device)[0] < 9:
        return False
    return all(
        t.data_ptr() % 16 == 0 and all((st * t.element_size()) % 16 == 0 for st in t.stride()[:-1])
        for t in (k, v)
    )


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, block_rows: int) -> tuple:
    """Descriptors of K and V ``[B, Hkv, L, D]`` with ``[1, 1, block_rows, D]`` boxes."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(
        TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_rows, t.shape[-1]])
        for t in (k, v)
    )


def kernel_kv_args(
    k: torch.Tensor, v: torch.Tensor, block_rows: int, descriptors: bool | None = None
) -> tuple[tuple, bool]:
    """``((K_desc, V_desc), USE_DESC)`` for a kernel launch; without descriptors (``descriptors``
    False, or automatic and :func:`use_descriptors` False) K and V stand in for the unused
    arguments."""
    if use_descriptors(k, v, descriptors):
        return kv_descriptors(k, v, block_rows), True
    return (k, v), False
