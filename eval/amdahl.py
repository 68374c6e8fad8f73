"""Amdahl's model of a prefill at an attention density: a formula over recorded timings, one
home for the e2e producer (``experiments/e2e.py`` ``derive``: the bound against SDPA flash) and the
analysis that reads its records (``analysis/e2e_table.py`` ``ttft_frame``: the bound against
dense SDPA), so neither imports the other."""

from __future__ import annotations


def amdahl_ms(dense: dict, density: float) -> float:
    """Amdahl at ``density``: a dense row's time (``total_ms``) with its selected layers'
    attention (``sparse_attention_ms``) scaled by the density and the rest unchanged (estimation
    free): what a perfect kernel at that density would give."""
    attn = dense["sparse_attention_ms"]
    return dense["total_ms"] - attn + density * attn
