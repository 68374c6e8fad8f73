"""What makes a job fail before it runs (:class:`ConfigError`) or after (:func:`non_finite`).

Light on purpose (no Hydra, no OmegaConf, no torch): ``experiments/records.py`` and the kernel
benchmarks, which must run without the harness's packages, import it."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A bad command line or config value; run.py reports it in one line that names the key."""


def non_finite(metrics: object, prefix: str = "") -> list[str]:
    """Dotted names of every NaN/Inf float in a metrics tree (a NaN metric is never ``ok``)."""
    if isinstance(metrics, float):
        return [] if math.isfinite(metrics) else [f"{prefix}={metrics}"]
    if isinstance(metrics, dict):
        items = metrics.items()
    elif isinstance(metrics, list):
        items = ((str(i), v) for i, v in enumerate(metrics))
    else:
        return []
    out = []
    for key, value in items:
        out += non_finite(value, f"{prefix}.{key}" if prefix else str(key))
    return out
