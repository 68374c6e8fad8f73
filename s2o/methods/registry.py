"""One interface for every attention method: ``estimate`` (build the sparse plan) then ``attend``.

A method is registered once with its knobs and defaults; :func:`sparse_attention` validates the
name and the knobs, and times the two phases separately when asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from ..stats import AttentionStats
from ..validation import (
    check_inference_inputs,
    check_interpreter_dtype,
    check_qkv,
    check_scale,
    resolve_impl,
)


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
        prepare: ``(**knobs) -> knobs`` normalizing validated knobs once (e.g. S2O's
            effective ``q_perm``), so ``estimate``/``attend`` never re-validate per call.
        coverage: ``(plan, stats, rows [R], seq_len, **knobs) -> [B, Hq, R, L]`` bool, the keys
            the method computed for the query positions ``rows`` in the call that made
            ``plan`` and ``stats`` (evidence recall, ``eval/evidence.py``); ``None``: unknown.
        layer_knobs: knobs that choose which layers of a model run the method (FlashPrefill v2's
            ``dense_first_layers``). Only the model plug-in (``s2o.hf.sparse_prefill``) knows a
            layer's index: it reads them and calls the method per layer with them at their
            defaults; a per-call use (an operator run, :func:`sparse_attention`) with another
            value is refused, never ignored.
        optional_knobs: knobs added after runs and records were made, off by default (S2O's
            ``mean_correction``): left out of ``conf/method/<name>.yaml``, and of a crossover
            key while at their default (:func:`s2o.crossover.key_knobs`), so a default run's id
            and the records made before them stand as they did.
    """

    name: str
    estimate: Callable[..., Any]
    attend: Callable[..., tuple[torch.Tensor, AttentionStats]]
    defaults: dict[str, Any]
    main_knob: str | None = None
    sparsity_increases_with_knob: bool = True
    check: Callable[..., None] = field(default=lambda **_: None)
    prepare: Callable[..., dict[str, Any]] = field(default=lambda **knobs: knobs)
    coverage: Callable[..., torch.Tensor] | None = None
    layer_knobs: tuple[str, ...] = ()
    optional_knobs: tuple[str, ...] = ()

    def bind(self, **knobs) -> BoundMethod:
        """Validate ``knobs`` once and return a callable ``(q, k, v) -> (out, stats)``."""
        full = self.validate(knobs)
        return BoundMethod(self, MappingProxyType(self.prepare(**full)), MappingProxyType(full))

    def validate(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``knobs``, checked; ``ValueError`` names a bad knob or value."""
        unknown = sorted(set(knobs) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"unknown knob(s) {unknown} for method {self.name!r}; "
                f"valid knobs: {sorted(self.defaults)}"
            )
        full = {**self.defaults, **knobs}
        self.check(**full)
        return full


@dataclass(frozen=True)
class BoundMethod:
    """A method with its knobs validated and normalized once (see :meth:`Method.bind`).

    Calling it checks only the tensors (cheap shape/dtype checks), so a model with many layers
    pays the knob validation once per context, not once per layer call.

    Attributes:
        method: the registered :class:`Method`.
        knobs: the normalized knobs handed to ``estimate``/``attend`` (read-only).
        config: the validated knobs as the user gave them plus defaults (read-only), for records.
    """

    method: Method
    knobs: Mapping[str, Any]
    config: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.method.name

    def per_layer(self) -> BoundMethod:
        """This bound method as a model plug-in calls it on one chosen layer: its layer knobs
        (see :class:`Method`) at their defaults; ``config`` keeps the values given."""
        knobs = {**self.knobs, **{k: self.method.defaults[k] for k in self.method.layer_knobs}}
        return BoundMethod(self.method, MappingProxyType(knobs), self.config)

    def _knobs(self, scale: float | None) -> Mapping[str, Any]:
        if scale is None:
            return self.knobs
        return {**self.knobs, "scale": check_scale(scale)}

    def estimate(self, q, k, v, *, scale: float | None = None) -> Any:
        """The method's plan (Step 1 for S2O, the block pattern for the baselines)."""
        check_qkv(q, k, v)
        check_no_layer_knobs(self.method, self.knobs)
        if "impl" in self.knobs:
            check_interpreter_dtype(resolve_impl(self.knobs["impl"], q.device), q)
        return self.method.estimate(q, k, v, **self._knobs(scale))

    def coverage(self, plan, stats: AttentionStats, rows: torch.Tensor, seq_len: int):
        """``[B, Hq, R, L]`` bool: the keys computed for query positions ``rows`` (see
        :class:`Method`); ``NotImplementedError`` for a method without it."""
        if self.method.coverage is None:
            raise NotImplementedError(f"method {self.name!r} does not report the keys it visits")
        return self.method.coverage(plan, stats, rows, seq_len, **self.knobs)

    def attend(self, q, k, v, plan, *, scale: float | None = None):
        """``(out [B, Hq, L, D], AttentionStats)`` from a plan made by :meth:`estimate`."""
        return self.method.attend(q, k, v, plan, **self._knobs(scale))

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        timing: bool = False,
    ) -> tuple[torch.Tensor, AttentionStats]:
        """Run on ``q [B, Hq, L, D]``, ``k, v [B, Hkv, L, D]``; ``scale`` (finite, > 0) overrides
        the bound one for this call (a model passes its own softmax scale per layer call)."""
        t0 = _now_ms(q.device) if timing else 0.0
        plan = self.estimate(q, k, v, scale=scale)
        t1 = _now_ms(q.device) if timing else 0.0
        out, stats = self.attend(q, k, v, plan, scale=scale)
        if timing:
            t2 = _now_ms(q.device)
            stats.time_estimate_ms, stats.time_attention_ms = t1 - t0, t2 - t1
        return out, stats


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def resolve_knobs(method: str, knobs: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
    """The method and its full knob dict (defaults overridden by ``knobs``), validated and
    normalized: what ``m.estimate``/``m.attend`` take."""
    m = _lookup(method)
    full = m.validate(knobs)
    check_no_layer_knobs(m, full)
    return m, m.prepare(**full)


def check_no_layer_knobs(method: Method, knobs: Mapping[str, Any]) -> None:
    """``ValueError`` if a layer knob (see :class:`Method`) is set away from its default in a
    per-call use, where no layer index exists to apply it to."""
    for key in method.layer_knobs:
        if knobs.get(key, method.defaults[key]) != method.defaults[key]:
            raise ValueError(
                f"{key}={knobs[key]!r} chooses which layers of a model run {method.name!r}: it "
                f"takes effect in s2o.hf.sparse_prefill (kind=accuracy, e2e); a single attention "
                f"call has no layer index, so leave it at {method.defaults[key]!r} here"
            )


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

    Inference only: inputs that require grad (with grad enabled) and NaN/Inf inputs raise
    ``ValueError`` naming the tensor (and the position). A bound method called per layer
    (:func:`bind`) skips the NaN scan, which costs a reduction and a host sync.
    """
    bound = bind(method, **knobs)
    check_qkv(q, k, v)
    check_inference_inputs(q, k, v)
    return bound(q, k, v, timing=timing)


def bind(method: str, **knobs) -> BoundMethod:
    """``METHODS[method].bind(**knobs)``: validate once, call many times (see :class:`BoundMethod`).

    Raises ``ValueError`` for an unknown method or knob, or a bad knob value.
    """
    return _lookup(method).bind(**knobs)


def _lookup(method: object) -> Method:
    if not isinstance(method, str):
        raise ValueError(f"method must be a str naming a method, got {method!r}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid methods: {sorted(METHODS)}")
    return METHODS[method]
