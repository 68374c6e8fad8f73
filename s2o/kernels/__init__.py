"""Triton kernels for S2O (Step 1, Pass-1, Pass-2, fused). Never imports ``s2o.reference``."""

from __future__ import annotations


def s2o_triton(q, k, v, **knobs):
    raise NotImplementedError(
        "the S2O Triton kernels are not implemented yet; use impl='reference'"
    )
