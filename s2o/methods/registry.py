"""One interface for every attention method: ``estimate`` (build the sparse plan) then ``attend``.

A method is registered once with its knobs and defaults; :func:`sparse_attention` validates the
name and the knobs, and times the two phases separately when asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..stats import AttentionStats
from ..validation import check_qkv


@dataclass(frozen=True)
class Method:
    """A registered attention method.

    Attributes:
        name: registry key, e.g. ``"s2o"``.
        estimate: ``(q, k, v, **knobs) -> plan`` (anything; ``None`` for dense attention).
        attend: ``(q, k, v, plan, **knobs) -> (out, AttentionStats)``.
        defaults: every knob the method accepts, with its default (the paper's setting).
        main_knob: the knob that trades accuracy for sparsity (tuned for matched sparsity).
        sparsity_increases_with_knob: direction of ``main_knob`` (True: larger -> sparser).
        check: ``(**knobs) -> None`` raising ``ValueError`` for a bad value.
    """

    name: str
    estimate: Callable[..., Any]
    attend: Callable[..., tuple[torch.Tensor, AttentionStats]]
    defaults: dict[str, Any]
    main_knob: str | None = None
    sparsity_increases_with_knob: bool = True
    check: Callable[..., None] = field(default=lambda **_: None)


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def resolve_knobs(method: str, knobs: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
    """The method and its full knob dict (defaults overridden by ``knobs``), validated."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid methods: {sorted(METHODS)}")
    m = METHODS[method]
    unknown = sorted(set(knobs) - set(m.defaults))
    if unknown:
        raise ValueError(
            f"unknown knob(s) {unknown} for method {method!r}; valid knobs: {sorted(m.defaults)}"
        )
    full = {**m.defaults, **knobs}
    m.check(**full)
    return m, full


def _now_ms(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3


def sparse_attention(
    method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, timing: bool = False, **knobs
) -> tuple[torch.Tensor, AttentionStats]:
    """Run ``method`` on causal prefill inputs.

    Args:
        method: a key of :data:`METHODS` (``full``, ``s2o``, ...).
        q: ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]``, ``Hq % Hkv == 0``.
        timing: synchronize and fill ``stats.time_estimate_ms`` / ``stats.time_attention_ms``
            (wall clock of one call; benchmarks use ``do_bench`` instead).
        **knobs: method knobs; unknown ones raise ``ValueError`` listing the valid ones.
    Returns:
        ``(out [B, Hq, L, D] in q's dtype, AttentionStats)``.
    """
    m, full = resolve_knobs(method, knobs)
    check_qkv(q, k, v)
    t0 = _now_ms(q.device) if timing else 0.0
    plan = m.estimate(q, k, v, **full)
    t1 = _now_ms(q.device) if timing else 0.0
    out, stats = m.attend(q, k, v, plan, **full)
    if timing:
        t2 = _now_ms(q.device)
        stats.time_estimate_ms, stats.time_attention_ms = t1 - t0, t2 - t1
    return out, stats
