"""Any method as the prefill attention of a Hugging Face model; decoding stays dense.

    from s2o.hf import sparse_prefill

    with sparse_prefill(model, "s2o", tau=0.005, segment_len=2048) as run:
        out = model.generate(ids, max_new_tokens=32, do_sample=False)
    print(run.stats)   # the last prefill: per layer density per head, estimation/attention ms

How it plugs in: transformers' ``AttentionInterface`` (and ``AttentionMaskInterface``, so the mask
a model builds is SDPA's) gets one function, ``s2o_sparse``; entering the context switches the
model's ``attn_implementation`` to it, leaving restores the previous one. No model class is
patched, so every model whose attention dispatches through ``ALL_ATTENTION_FUNCTIONS`` works
(Llama, Qwen3, Gemma 3, SmolLM2 checked). Each attention call is routed:

- **prefill** (query length = key length, no past) of a *selected* layer, at least ``min_len``
  tokens long: the bound method (``sparse_attention``'s knobs, validated once on entering) on
  ``q [B, Hq, L, D]``, ``k, v [B, Hkv, L, D]`` (GQA is never materialized), with the model's own
  softmax scale (Gemma: ``query_pre_attn_scalar ** -0.5``);
- every other call (decode, unselected layers, sliding-window layers by default, the first
  ``N`` layers of a method bound with ``dense_first_layers=N`` (FlashPrefill v2's recipe),
  prefill shorter than ``min_len``): transformers' SDPA attention, with the model's own mask.
  Inside the context the dense calls therefore run SDPA even if the model was loaded with another
  implementation.

``min_len="auto"``: the length from which the method beats dense attention on this GPU, for the
model's head shape and dtype and the method's knobs, read once on entering from a committed
crossover record (``benchmarks/crossover.py``; the lookup is :mod:`s2o.crossover`, which
reads ``results/``, so "auto" needs the repository's checkout). No record for them: an error that
names the command measuring it; never a default. The stats say which value held and from where.

The tensors a layer hands the method are not scanned for NaN/Inf (``sparse_attention`` does
that; here it would synchronize the GPU at every layer): a model whose activations overflow
gets the method's output for them, not an error.

Refused with an error (never run dense silently): chunked prefill or a prefill with a past (more
than one query, fewer queries than keys), an attention mask in a sparse prefill (padding in the
batch, a static cache, a custom mask), soft-capped logits, attention dropout, sliding-window
layers selected for sparse prefill, and a model that never calls the plug-in.

Statistics (:class:`PrefillStats`, one per prefill forward): per layer the density per (sample,
head) in query-key tiles against a dense causal tiled kernel (the project-wide unit, see
:mod:`s2o.stats`), the estimation and attention time, and the whole forward's time. A sample's
prefill density is the plain mean over the sparse layers and their query heads of the per-head
density; all sparse layers of one prefill see the same length and tiles, so this equals the
tile-weighted mean. Sparsity = 1 - density. Timing uses CUDA events on a GPU (no synchronization
inside the forward) and the wall clock on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .methods import BoundMethod, bind

ATTN_NAME = "s2o_sparse"
LAYER_CHOICES = ("full", "all")

# id(attention module) -> (run, layer index); filled while a context is active.
_ROUTES: dict[int, tuple[SparsePrefill, int]] = {}


class _Clock:
    """Timestamps without synchronizing: CUDA events on a GPU, ``perf_counter`` on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, start: Any, end: Any) -> float:
        if self.cuda:
            return float(start.elapsed_time(end))
        return (end - start) * 1e3


@dataclass
class LayerStats:
    """One attention call of one prefill.

    Attributes:
        layer: the model's layer index.
        sparse: whether the method ran (False: dense SDPA, see ``reason``).
        reason: why the layer ran dense (``None`` when sparse).
        density: ``[B, Hq]`` float64, computed tiles / dense causal tiles (``None`` when dense).
        estimate_ms, attention_ms: estimation (the method's plan) and attention time.
        mse, rel_mse: with ``measure_error``, the layer's output error against dense attention
            on the same Q/K/V (mean over batch, heads, rows, channels; relative: divided by the
            mean square of the dense output); ``None`` otherwise.
    """

    layer: int
    sparse: bool
    reason: str | None
    density: torch.Tensor | None
    estimate_ms: float = 0.0
    attention_ms: float = 0.0
    mse: float | None = None
    rel_mse: float | None = None
    _marks: tuple = field(default=(), repr=False)


@dataclass
class PrefillStats:
    """One prefill forward through the model inside :func:`sparse_prefill`.

    Attributes:
        method: the method name; knobs: its validated knobs.
        batch, length: the prefill's batch size and token count.
        layers: one :class:`LayerStats` per attention layer, in call order.
        total_ms: the whole model forward (embeddings to logits); ``None`` if not observed.
        min_len: ``{"value": int | None, "source": str}``, the ``min_len`` in force (``None``:
            every prefill dense, see :class:`SparsePrefill`) and where it came from.
    """

    method: str
    knobs: dict
    batch: int
    length: int
    layers: list[LayerStats] = field(default_factory=list)
    total_ms: float | None = None
    min_len: dict | None = None
    _marks: tuple = field(default=(), repr=False)

    @property
    def sparse_layers(self) -> list[int]:
        return [s.layer for s in self.layers if s.sparse]

    @property
    def density_per_sample(self) -> list[float] | None:
        """Per sample: mean density over the sparse layers and their heads; ``None`` if no layer
        ran sparse (all dense: see each layer's ``reason``)."""
        dens = [s.density for s in self.layers if s.sparse]
        if not dens:
            return None
        return torch.stack(dens).mean(dim=(0, 2)).tolist()

    @property
    def density(self) -> float | None:
        """Mean of :attr:`density_per_sample` (``None`` when no layer ran sparse)."""
        per = self.density_per_sample
        return None if per is None else sum(per) / len(per)

    @property
    def sparsity(self) -> float | None:
        d = self.density
        return None if d is None else 1.0 - d

    @property
    def estimate_ms(self) -> float:
        return sum(s.estimate_ms for s in self.layers)

    @property
    def sparse_attention_ms(self) -> float:
        return sum(s.attention_ms for s in self.layers if s.sparse)

    @property
    def dense_attention_ms(self) -> float:
        return sum(s.attention_ms for s in self.layers if not s.sparse)

    @property
    def rest_ms(self) -> float | None:
        """Everything but attention and estimation (projections, MLPs, norms, logits)."""
        if self.total_ms is None:
            return None
        return self.total_ms - self.estimate_ms - self.sparse_attention_ms - self.dense_attention_ms

    def summary(self) -> dict:
        """Plain-Python numbers for a record: per-sample density, per-layer density, timing."""
        return {
            "method": self.method,
            "batch": self.batch,
            "length": self.length,
            "min_len": self.min_len,
            "sparse_layers": self.sparse_layers,
            "dense_layers": {s.layer: s.reason for s in self.layers if not s.sparse},
            "density": self.density,
            "sparsity": self.sparsity,
            "density_per_sample": self.density_per_sample,
            "density_per_layer": {
                s.layer: float(s.density.mean()) for s in self.layers if s.sparse
            },
            **self._errors(),
            "estimate_ms": self.estimate_ms,
            "sparse_attention_ms": self.sparse_attention_ms,
            "dense_attention_ms": self.dense_attention_ms,
            "rest_ms": self.rest_ms,
            "total_ms": self.total_ms,
        }

    def _errors(self) -> dict:
        errs = [s for s in self.layers if s.sparse and s.mse is not None]
        if not errs:
            return {}
        return {
            "mse": sum(s.mse for s in errs) / len(errs),
            "rel_mse": sum(s.rel_mse for s in errs) / len(errs),
            "error_per_layer": {s.layer: {"mse": s.mse, "rel_mse": s.rel_mse} for s in errs},
        }

    def __str__(self) -> str:
        head = (
            f"prefill {self.method} B={self.batch} L={self.length}: density "
            f"{_fmt(self.density)} over layers {self.sparse_layers}; estimate "
            f"{self.estimate_ms:.2f} ms, sparse attention {self.sparse_attention_ms:.2f} ms, "
            f"dense attention {self.dense_attention_ms:.2f} ms, "
            f"total {_fmt(self.total_ms, '.2f')} ms"
        )
        rows = [f"{'layer':>5}  {'mode':<6} {'density':>8} {'est_ms':>8} {'attn_ms':>8}  heads"]
        for s in self.layers:
            per_head = (
                ""
                if s.density is None
                else " ".join(f"{x:.3f}" for x in s.density.mean(dim=0).tolist())
            )
            mode = "sparse" if s.sparse else "dense"
            dens = _fmt(None if s.density is None else float(s.density.mean()))
            rows.append(
                f"{s.layer:>5}  {mode:<6} {dens:>8} {s.estimate_ms:>8.2f} {s.attention_ms:>8.2f}  "
                f"{per_head or s.reason}"
            )
        return "\n".join([head, *rows])


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


class SparsePrefill:
    """The object :func:`sparse_prefill` yields: the bound method and the prefills' statistics.

    Attributes:
        method: the :class:`~s2o.methods.BoundMethod` every sparse layer runs.
        layers: the model layer indices that run sparse in a prefill of at least ``min_len``.
        min_len: prefills shorter than this stay dense (each layer's ``reason`` says so);
            ``None``: every prefill stays dense (``min_len="auto"`` and the method was faster
            than dense at no length measured).
        min_len_source: ``"given"`` or the crossover record ``min_len="auto"`` read.
        prefills: one :class:`PrefillStats` per prefill forward, in order.
        decode_calls: attention calls with a past (dense SDPA).
    """

    def __init__(
        self, model, method: BoundMethod, layers: list[int], min_len: int | None, timing: bool,
        sliding: dict[int, int] | None = None, measure_error: bool = False, observe=None,
        dense_first: int = 0, min_len_source: str = "given",
    ):  # fmt: skip
        self.model = model
        self.min_len_source = min_len_source
        self.dense_first = dense_first
        self.observe = observe
        self.measure_error = measure_error
        self.sliding = sliding or {}
        self.method = method
        self.layers = layers
        self.min_len = min_len
        self.timing = timing
        self.prefills: list[PrefillStats] = []
        self.decode_calls = 0
        self._device = next(model.parameters()).device
        self._clock = _Clock(self._device)
        self._forward: PrefillStats | None = None
        self._forward_start = None
        self._forward_calls = 0
        self._in_forward = False
        self._selected = set(layers)

    @property
    def stats(self) -> PrefillStats:
        """The last prefill's statistics (timings resolved: this synchronizes the GPU)."""
        if not self.prefills:
            raise RuntimeError("no prefill ran inside this sparse_prefill context yet")
        return self.finalize()[-1]

    def finalize(self) -> list[PrefillStats]:
        """Resolve every pending timestamp (one synchronization) and return :attr:`prefills`."""
        if self._clock.cuda:
            torch.cuda.synchronize(self._device)
        for p in self.prefills:
            for s in p.layers:
                if s._marks:
                    t0, t1, t2 = s._marks
                    s.estimate_ms, s.attention_ms = self._clock.ms(t0, t1), self._clock.ms(t1, t2)
                    s._marks = ()
                if s.density is not None and s.density.device.type != "cpu":
                    s.density = s.density.cpu()
                if isinstance(s.mse, torch.Tensor):
                    s.mse, s.rel_mse = float(s.mse), float(s.rel_mse)
            if p._marks and p._marks[1] is not None:
                p.total_ms, p._marks = self._clock.ms(*p._marks), ()
        return self.prefills

    def reset(self) -> None:
        """Forget the recorded prefills (e.g. between warm-up and measured runs)."""
        self.prefills, self.decode_calls = [], 0

    # -- called by the model ----------------------------------------------------------------

    def _start_forward(self) -> None:
        """A model forward begins (prefill or decode: its first attention call tells)."""
        self._forward = None
        self._forward_start = self._clock.mark() if self.timing else None
        self._forward_calls = 0
        self._in_forward = True

    def _begin_forward(self, batch: int, length: int) -> None:
        if self._in_forward:  # the model-level hook marked the forward's start
            start = self._forward_start
        else:  # an attention call outside a model forward (a submodule called alone)
            start = self._clock.mark() if self.timing else None
        self._forward = PrefillStats(self.method.name, dict(self.method.config), batch, length)
        self._forward.min_len = {"value": self.min_len, "source": self.min_len_source}
        self._forward._marks = (start, None)
        self.prefills.append(self._forward)

    def _end_forward(self) -> None:
        p, self._forward = self._forward, None
        calls, self._forward_calls, self._in_forward = self._forward_calls, 0, False
        if calls == 0:
            raise RuntimeError(
                f"sparse_prefill: a forward of {type(self.model).__name__} ran without calling the "
                f"'{ATTN_NAME}' attention: the model does not dispatch through transformers' "
                "AttentionInterface, so no method ran"
            )
        if p is not None and self.timing and p._marks[0] is not None:
            p._marks = (p._marks[0], self._clock.mark())

    def _attend(self, module, layer: int, query, key, value, attention_mask, **kwargs):
        q_len, k_len = query.shape[-2], key.shape[-2]
        self._forward_calls += 1
        if q_len != k_len:
            if q_len > 1:
                raise NotImplementedError(
                    f"sparse_prefill: layer {layer} got {q_len} queries against {k_len} keys "
                    "(chunked prefill, a prefill after a past, or a static cache); only a whole "
                    "prefill from an empty DynamicCache can run sparse. Prefill in one call."
                )
            self.decode_calls += 1
            return attend_dense(module, query, key, value, attention_mask, **kwargs)
        reason = self._dense_reason(layer, q_len)
        if reason is None:
            self._check_sparse_call(layer, attention_mask, kwargs)
        if self._forward is None:  # the first attention call of a prefill (q_len = k_len)
            self._begin_forward(query.shape[0], q_len)
        t0 = self._clock.mark() if self.timing else None
        if reason is not None:
            out = attend_dense(module, query, key, value, attention_mask, **kwargs)
            t2 = self._clock.mark() if self.timing else None
            stat = LayerStats(
                layer, False, reason, None, _marks=(t0, t0, t2) if self.timing else ()
            )
        else:
            scale = kwargs.get("scaling")
            mark = self._clock.mark if self.timing else _no_mark
            out, o, plan, st, t1 = attend_sparse(self.method, query, key, value, scale, mark)
            t2 = mark()
            stat = LayerStats(
                layer,
                True,
                None,
                st.density_per_head,  # moved to the CPU in finalize: no sync per layer
                _marks=(t0, t1, t2) if self.timing else (),
            )
            if self.measure_error:  # after the timed span: a dense pass on the same Q/K/V
                stat.mse, stat.rel_mse = _error_vs_dense(query, key, value, o, scale)
            if self.observe is not None:  # after the timed span too
                self.observe(layer, query, key, plan, st, scale, self.method)
        self._forward.layers.append(stat)
        return out

    def _dense_reason(self, layer: int, length: int) -> str | None:
        if layer not in self._selected:
            window = self.sliding.get(layer)
            if window:
                return f"sliding window {window}"
            if layer < self.dense_first:
                return f"dense first layers (dense_first_layers={self.dense_first})"
            return "not selected (layers=)"
        if self.min_len is None:
            return (
                "min_len=auto: not faster than dense at any length measured "
                f"({self.min_len_source})"
            )
        if length < self.min_len:
            if self.min_len_source == "given":
                return f"L={length} < min_len={self.min_len}"
            return f"L={length} < min_len={self.min_len} (auto: {self.min_len_source})"
        return None

    def _check_sparse_call(self, layer: int, attention_mask, kwargs: dict) -> None:
        if attention_mask is not None:
            raise NotImplementedError(
                f"sparse_prefill: layer {layer} got an attention mask in prefill (padding in the "
                "batch, a static cache or a custom mask); the sparse methods take unpadded causal "
                "prefill only: run one prompt per batch, or equal-length prompts without padding"
            )
        if kwargs.get("softcap") is not None:
            raise NotImplementedError(
                f"sparse_prefill: layer {layer} soft-caps its attention logits "
                f"(softcap={kwargs['softcap']}); no sparse method here supports soft-capping"
            )
        if kwargs.get("dropout", 0.0):
            raise NotImplementedError(
                f"sparse_prefill: layer {layer} asks for attention dropout "
                f"{kwargs['dropout']}; call model.eval() (the methods are inference-only)"
            )


def _no_mark() -> None:
    return None


def attend_dense(module, query, key, value, attention_mask, **kwargs) -> tuple:
    """A dense call: transformers' SDPA attention (``query [B, Hq, L, D]``, ``key, value
    [B, Hkv, S, D]``; returns ``(out [B, L, Hq, D], None)``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def attend_sparse(method: BoundMethod, query, key, value, scale: float | None, mark=_no_mark):
    """A sparse prefill call: the method's plan, ``mark()``, then its attention.

    ``query [B, Hq, L, D]``, ``key, value [B, Hkv, L, D]``. Returns ``((out [B, L, Hq, D], None),
    o [B, Hq, L, D], plan, AttentionStats, what mark() returned)``; ``benchmarks/crossover.py``
    times this call against :func:`attend_dense`.
    """
    plan = method.estimate(query, key, value, scale=scale)
    t1 = mark()
    o, st = method.attend(query, key, value, plan, scale=scale)
    return (o.transpose(1, 2).contiguous(), None), o, plan, st, t1


def _error_vs_dense(q, k, v, out, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mse, relative mse)`` of ``out`` against dense causal SDPA on the same inputs, as 0-dim
    fp32 tensors (read at :meth:`SparsePrefill.finalize`, so no synchronization here)."""
    from .methods.full import full_attention

    ref = full_attention(q, k, v, scale=scale).float()
    mse = (out.float() - ref).pow(2).mean()
    return mse, mse / ref.pow(2).mean().clamp_min(torch.finfo(torch.float32).tiny)


def _attention_fn(module, query, key, value, attention_mask, **kwargs):
    """The ``s2o_sparse`` attention function transformers calls (layout ``[B, H, L, D]``)."""
    route = _ROUTES.get(id(module))
    if route is None:
        raise RuntimeError(
            f"the '{ATTN_NAME}' attention was called outside a sparse_prefill context (module "
            f"{type(module).__name__}); enter `with s2o.hf.sparse_prefill(model, ...)` instead of "
            f"loading the model with attn_implementation='{ATTN_NAME}'"
        )
    run, layer = route
    return run._attend(module, layer, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Register ``s2o_sparse`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, _attention_fn)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


def attention_layers(model) -> dict[int, torch.nn.Module]:
    """``{layer index: attention module}`` of the modules that call transformers' attention
    interface (they carry ``layer_idx``, ``scaling`` and ``num_key_value_groups``)."""
    found = {}
    for mod in model.modules():
        if all(hasattr(mod, a) for a in ("layer_idx", "scaling", "num_key_value_groups")):
            found[int(mod.layer_idx)] = mod
    return dict(sorted(found.items()))


def sliding_layers(model, modules: dict[int, torch.nn.Module]) -> dict[int, int]:
    """``{layer index: window}`` of the sliding-window layers (Gemma 3, Qwen3 with windows)."""
    out = {}
    for idx, mod in modules.items():
        window = getattr(mod, "sliding_window", None)
        if window:
            out[idx] = int(window)
    return out


def _select_layers(layers, modules: dict, sliding: dict[int, int]) -> list[int]:
    if isinstance(layers, str):
        if layers not in LAYER_CHOICES:
            raise ValueError(f"layers={layers!r} is not one of {list(LAYER_CHOICES)} or a list")
        chosen = [i for i in modules if layers == "all" or i not in sliding]
    elif isinstance(layers, Sequence) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in layers
    ):
        bad = sorted(set(layers) - set(modules))
        if bad:
            raise ValueError(
                f"layers {bad} are not attention layers; the model has {sorted(modules)}"
            )
        chosen = sorted(set(layers))
    else:
        raise ValueError(f"layers must be 'full', 'all' or a list of layer indices, got {layers!r}")
    windowed = [i for i in chosen if i in sliding]
    if windowed:
        raise ValueError(
            f"layers={layers!r} selects sliding-window layers {windowed} (window "
            f"{sliding[windowed[0]]}); the sparse methods attend the whole causal prefix and would "
            "change those layers: select full-attention layers only (layers='full', the default)"
        )
    return chosen


def _after_dense_first(layers: list[int], n: int) -> list[int]:
    """``layers`` without the indices below ``n`` (a method's ``dense_first_layers``: v2 keeps
    ``layer_id < n`` dense); ``ValueError`` if none is left."""
    kept = [i for i in layers if i >= n]
    if layers and not kept:
        raise ValueError(
            f"dense_first_layers={n} keeps every selected layer {layers} dense: nothing would "
            "run sparse"
        )
    return kept


def _set_implementation(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # transformers < 4.56
        model.config._attn_implementation = name


class sparse_prefill:  # noqa: N801 (a context manager used like a function)
    """Run ``method`` as the prefill attention of ``model`` inside a ``with`` block.

    Args:
        model: a transformers causal LM (``PreTrainedModel``) whose attention dispatches through
            ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen3, Gemma 3, ...), in eval mode.
        method: a name in :data:`s2o.METHODS` (``full``, ``s2o``, ``flexprefill``, ``xattn``,
            ``pbs``).
        layers: ``"full"`` (default: every full-attention layer; sliding-window layers stay
            dense), ``"all"`` (every layer; refused if the model has sliding-window layers), or a
            list of layer indices. A method knob ``dense_first_layers=N`` (FlashPrefill) then
            takes the indices below ``N`` out of this selection.
        min_len: prefills shorter than this many tokens stay dense (the stats say so), or
            ``"auto"``: the crossover length measured on this GPU for the model's head shape and
            dtype and this method with these knobs (:mod:`s2o.crossover`, read once on
            entering; ``LookupError`` naming the command that measures it when there is none;
            ``ValueError`` for a model off the GPU). ``run.stats.summary()["min_len"]`` gives
            the value in force and its source.
        timing: record estimation/attention/forward times (CUDA events: no synchronization).
        measure_error: also run dense attention on every sparse layer's Q/K/V (outside the timed
            span) and record the layer's MSE and relative MSE against it (``run.stats.summary()``:
            ``mse``, ``rel_mse``, ``error_per_layer``): operator error on the same points as the
            accuracy and density.
        observe: ``observe(layer, q, k, plan, stats, scale, method)``, called after every sparse
            layer's timed span with its post-RoPE ``q [B, Hq, L, D]``, ``k [B, Hkv, L, D]``, the
            method's plan and :class:`~s2o.stats.AttentionStats` and the bound method (evidence
            recall, ``eval/evidence.py``, uses it); its time counts in the forward's total.
        **knobs: the method's knobs, validated and bound once here (``ValueError`` names a bad one).
    Yields:
        a :class:`SparsePrefill`: ``run.stats`` is the last prefill's :class:`PrefillStats`.

    Leaving the block restores the model's attention implementation exactly.
    """

    def __init__(
        self, model, method: str, *, layers="full", min_len: int | str = 0, timing: bool = True,
        measure_error: bool = False, observe=None, **knobs,
    ):  # fmt: skip
        if observe is not None and not callable(observe):
            raise ValueError(f"observe must be a callable or None, got {observe!r}")
        self.observe = observe
        if min_len != "auto" and (
            isinstance(min_len, bool) or not isinstance(min_len, int) or min_len < 0
        ):
            raise ValueError(f"min_len must be an int >= 0 or 'auto', got {min_len!r}")
        self.model = model
        self.bound = bind(method, **knobs)
        if self.bound.config.get("causal", True) is not True:
            raise ValueError("causal=False: a causal LM's prefill is causal; leave causal at True")
        if not isinstance(measure_error, bool):
            raise ValueError(f"measure_error must be a bool, got {measure_error!r}")
        self.layers_arg, self.min_len, self.timing = layers, min_len, bool(timing)
        self.measure_error = measure_error
        self.run: SparsePrefill | None = None

    def __enter__(self) -> SparsePrefill:
        model = self.model
        _check_model(model)
        modules = attention_layers(model)
        if not modules:
            raise ValueError(
                f"{type(model).__name__} has no attention modules with layer_idx/scaling: it does "
                "not use transformers' AttentionInterface, so sparse_prefill cannot reach it"
            )
        if any(id(m) in _ROUTES for m in modules.values()):
            raise RuntimeError("this model is already inside a sparse_prefill context")
        sliding = sliding_layers(model, modules)
        layers = _select_layers(self.layers_arg, modules, sliding)
        dense_first = self.bound.config.get("dense_first_layers", 0)
        layers = _after_dense_first(layers, dense_first)
        min_len, source = self._resolve_min_len(model)
        register()
        run = SparsePrefill(
            model, self.bound.per_layer(), layers, min_len, self.timing, sliding,
            self.measure_error, self.observe, dense_first, source,
        )  # fmt: skip
        self._previous = model.config._attn_implementation
        self._hooks = [
            model.register_forward_pre_hook(_pre_forward(run), with_kwargs=True),
            model.register_forward_hook(lambda *_: run._end_forward()),
        ]
        _ROUTES.update({id(m): (run, idx) for idx, m in modules.items()})
        self._modules = modules
        try:
            _set_implementation(model, ATTN_NAME)
        except Exception:
            self._restore()
            raise
        self.run = run
        return run

    def _resolve_min_len(self, model) -> tuple[int | None, str]:
        """``(min_len, source)``: as given, or for ``"auto"`` from the crossover record of this
        GPU, head shape, dtype, method and knobs."""
        if self.min_len != "auto":
            return self.min_len, "given"
        from s2o.crossover import lookup

        found = lookup(crossover_key(model, self.bound), self.bound.method.defaults)
        return found.min_len, found.source

    def __exit__(self, *exc) -> None:
        self._restore()
        _set_implementation(self.model, self._previous)
        if self.run is not None:
            self.run.finalize()

    def _restore(self) -> None:
        for h in self._hooks:
            h.remove()
        for m in self._modules.values():
            _ROUTES.pop(id(m), None)


def device_name(device: torch.device) -> str:
    """The GPU model a crossover is measured on (``torch.cuda.get_device_name``); ``ValueError``
    off the GPU (CPU times never stand for a GPU's)."""
    if device.type != "cuda":
        raise ValueError(
            f"min_len='auto' reads a crossover measured on a GPU; this model is on {device}: "
            "pass an int min_len"
        )
    return torch.cuda.get_device_name(device)


def crossover_key(model, bound: BoundMethod):
    """The :class:`s2o.crossover.CrossoverKey` of ``model`` (its text config's head
    shape, its parameters' device and dtype) and ``bound`` (its knobs without the layer knobs)."""
    from s2o.crossover import CrossoverKey

    hq, hkv, head_dim = head_shape(model)
    param = next(model.parameters())
    knobs = {k: v for k, v in bound.config.items() if k not in bound.method.layer_knobs}
    return CrossoverKey(device_name(param.device), hq, hkv, head_dim,
                        str(param.dtype).removeprefix("torch."), bound.name, knobs)  # fmt: skip


def head_shape(model) -> tuple[int, int, int]:
    """``(query heads, key/value heads, head_dim)`` of ``model``'s attention layers (its text
    config; ``head_dim`` from hidden size / heads where the config names none)."""
    text = _text_config(model)
    hq = int(text.num_attention_heads)
    hkv = int(getattr(text, "num_key_value_heads", None) or hq)
    return hq, hkv, int(getattr(text, "head_dim", None) or text.hidden_size // hq)


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ValueError(
            f"model must be a transformers PreTrainedModel, got {type(model).__name__}"
        )
    if model.training:
        raise ValueError("the model is in training mode: call model.eval() (inference only)")
    text = _text_config(model)
    cap = getattr(text, "attn_logit_softcapping", None)
    if cap is not None:
        raise NotImplementedError(
            f"{type(model).__name__} soft-caps attention logits (attn_logit_softcapping={cap}); "
            "no sparse method here supports soft-capping"
        )


def _pre_forward(run: SparsePrefill):
    """Model-level hook: marks the start of a forward. Whether it is a prefill is decided by the
    first attention call (query length = key length), never by the forward's keyword names (which
    change between transformers releases: ``past_key_values`` in 5.17, ``cache`` in 5.24)."""

    def hook(module, args, kwargs):
        run._start_forward()

    return hook
