"""The ``launch`` knob: Triton launch settings carried by a method's bound configuration.

A value is ``None`` (the kernels' defaults for the head size and GPU) or a mapping of
``num_warps`` / ``num_stages`` / ``sub_n`` to positive ints (and, for Pass-2, ``walk``:
``"triton"`` or ``"gluon"``); S2O takes one such mapping per kernel (``{"pass2": {"num_warps":
8}}``). Checked when the method is bound; turned into
:class:`s2o.kernels.Launch` objects lazily, so the reference path never imports Triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELDS = ("num_warps", "num_stages", "sub_n", "walk")
WALKS = ("triton", "gluon")  # walk: Pass-2's ranked walk (s2o.kernels.launch.WALKS)


def check_settings(name: str, value: Any, walk_ok: bool = False) -> None:
    """``None`` or ``{field: positive int}`` over :data:`FIELDS` (``walk`` only where
    ``walk_ok``: S2O's Pass-2); ``ValueError`` names the key."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a mapping of {list(FIELDS)} to ints, got {value!r}")
    for key, v in value.items():
        if key not in FIELDS:
            raise ValueError(f"{name}: unknown launch setting {key!r}; valid: {list(FIELDS)}")
        if key == "walk":
            if not walk_ok:
                raise ValueError(f"{name}: walk is a setting of S2O's pass2 only")
            if v is not None and v not in WALKS:
                raise ValueError(f"{name}.walk must be one of {list(WALKS)} or None, got {v!r}")
            continue
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ValueError(f"{name}.{key} must be a positive int or None, got {v!r}")


def check_per_kernel(value: Any, kernels: tuple[str, ...]) -> None:
    """``None`` or ``{kernel: settings}`` with ``kernel`` in ``kernels``."""
    if value is None:
        return
    if not isinstance(value, Mapping) or not set(value) <= set(kernels):
        raise ValueError(f"launch must map kernels {list(kernels)} to settings, got {value!r}")
    for kernel, settings in value.items():
        check_settings(f"launch.{kernel}", settings, walk_ok=kernel == "pass2")


def to_launch(settings: Mapping | None):
    """A :class:`s2o.kernels.Launch` from checked settings (``None`` stays ``None``)."""
    if settings is None:
        return None
    from ..kernels.launch import Launch

    return Launch(**dict(settings))
