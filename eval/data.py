"""Q/K/V inputs of the operator study, by ``data.source``: synthetic | model | file.

Every source returns a list of layers ``(layer_id, q [B, Hq, L, D], k, v [B, Hkv, L, D])`` on the
requested device and dtype, plus a small description for the record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch

from . import synthetic
from .synthetic import spec_from_cfg, synthetic_qkv

Layer = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def load_safetensors_layers(
    path: str | Path, layers: list[int] | None, L: int | None, device, dtype
) -> list[Layer]:
    """Layers ``q.<i>``, ``k.<i>``, ``v.<i>`` of a safetensors file, optionally the first ``L``.

    A file that cannot be read (truncated, corrupt, not safetensors) or that holds non-float
    tensors raises ``ValueError`` naming the file (and the tensor)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return _read_layers(f, path, layers, L, device, dtype)
    except (SafetensorError, OSError) as exc:
        raise ValueError(
            f"{path}: cannot read this safetensors file ({exc}); it may be truncated or corrupt: "
            "delete it (a capture cache is rebuilt on the next run) or save it again"
        ) from exc


def _read_layers(f, path, layers, L, device, dtype) -> list[Layer]:
    keys = set(f.keys())
    found = sorted(int(k.split(".", 1)[1]) for k in keys if k.startswith("q."))
    wanted = found if layers is None else [int(i) for i in layers]
    missing = [f"{n}.{i}" for i in wanted for n in "qkv" if f"{n}.{i}" not in keys]
    if missing or not wanted:
        what = f"{', '.join(missing)} missing" if missing else "no q.<layer> tensor"
        raise ValueError(
            f"{path}: {what} (each layer needs q.<layer>, k.<layer> and v.<layer>); the file has "
            f"{_names(keys)}"
        )
    out = []
    for i in wanted:
        q, k, v = (f.get_tensor(f"{n}.{i}") for n in "qkv")
        for n, t in zip("qkv", (q, k, v)):
            if t.dtype not in FLOAT_DTYPES:
                raise ValueError(
                    f"{path}: tensor {n}.{i} has dtype {t.dtype}; Q/K/V must be floating point "
                    "(float16, bfloat16, float32): casting integers would change the numbers"
                )
        if L is not None:
            if L > q.shape[2]:
                raise ValueError(f"{path}: data.L={L} > stored length {q.shape[2]}")
            q, k, v = q[:, :, :L], k[:, :, :L], v[:, :, :L]
        out.append((i, *(t.to(device=device, dtype=dtype).contiguous() for t in (q, k, v))))
    return out


def _names(keys: set[str], most: int = 24) -> str:
    """The tensor names of a file, by layer (``q.0, k.0, v.0, q.1, ...``), the first ``most``."""

    def order(key: str):
        name, _, layer = key.partition(".")
        return (0, int(layer), "qkv".find(name), key) if layer.isdigit() else (1, 0, 0, key)

    names = sorted(keys, key=order)
    more = f", ... ({len(names)} in all)" if len(names) > most else ""
    return (", ".join(names[:most]) + more) if names else "no tensors"


def load_layers(
    data: dict, model: dict | None, device, dtype, input_cache: str | Path | None = None
) -> tuple[list[Layer], dict]:
    """Build or load the inputs described by the resolved ``data`` (and ``model``) config.

    ``input_cache``: a folder where a synthetic input is saved the first time it is built and
    loaded from afterwards (see :func:`cached_synthetic`); None builds it every time."""
    source = data["source"]
    if source == "synthetic":
        spec = spec_from_cfg(data)
        if input_cache is None:
            q, k, v = synthetic_qkv(spec, dtype=dtype, device=device)
            return [(0, q, k, v)], {"source": "synthetic"}
        (q, k, v), path, hit = cached_synthetic(spec, dtype, Path(input_cache))
        q, k, v = (t.to(device) for t in (q, k, v))
        return [(0, q, k, v)], {"source": "synthetic", "cache": str(path), "cache_hit": hit}
    if source == "file":
        layers = load_safetensors_layers(data["path"], data["layers"], data["L"], device, dtype)
        return layers, {"source": "file", "path": str(data["path"])}
    if source == "model":
        if model is None:
            raise ValueError("data=model needs a model: add model=llama31_8b or model=qwen3_8b")
        from .capture import capture_layer_ids, captured_layers

        path, hit = captured_layers(data, model, device)
        wanted = capture_layer_ids(data, model)
        layers = load_safetensors_layers(path, wanted, None, device, dtype)
        return layers, {"source": "model", "cache": str(path), "cache_hit": hit}
    raise ValueError(f"unknown data.source {source!r}; valid: synthetic, model, file")


def synthetic_cache_key(spec, dtype: torch.dtype) -> str:
    """What a saved synthetic input depends on: every knob of the spec, the dtype, the generator's
    source code and torch's version (its random streams); a change of any gives a new file."""
    h = hashlib.sha256()
    h.update(json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
    h.update(str(dtype).encode() + torch.__version__.encode())
    h.update(Path(synthetic.__file__).read_bytes())
    return h.hexdigest()[:16]


def cached_synthetic(
    spec, dtype: torch.dtype, folder: Path
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], Path, bool]:
    """The synthetic Q/K/V of ``spec`` (on the CPU) from ``folder``, built and saved there first
    if absent (written under a temporary name and renamed, so concurrent jobs never read a partial
    file). Returns the tensors, the file and whether it was there already. A file that cannot be
    read raises ``ValueError`` naming it."""
    path = folder / f"synthetic_L{spec.L}_{synthetic_cache_key(spec, dtype)}.pt"
    if path.exists():
        try:
            qkv = torch.load(path, map_location="cpu", weights_only=True)
            return (qkv["q"], qkv["k"], qkv["v"]), path, True
        except Exception as exc:  # noqa: BLE001  (any unreadable file: name it)
            raise ValueError(
                f"{path}: cannot read this cached synthetic input ({exc}); delete it and the "
                "next run builds it again"
            ) from exc
    q, k, v = synthetic_qkv(spec, dtype=dtype, device="cpu")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save({"q": q, "k": k, "v": v}, tmp)
    os.replace(tmp, path)
    return (q, k, v), path, False


ROOT = Path(__file__).resolve().parents[1]


def model_input(model: str, L: int, layers: list[int]) -> tuple[list, dict]:
    """Post-RoPE Q/K/V of ``layers`` of a model config (data=model, the essays), fp32, CPU."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/data/model.yaml"), resolve=True)
    model_cfg = OmegaConf.load(ROOT / f"conf/model/{model}.yaml")
    model_cfg = OmegaConf.to_container(model_cfg, resolve=True)
    data.update(L=L, layers=layers)
    out, info = load_layers(data, model_cfg, torch.device("cpu"), torch.float32)
    return out, {"model": model, "text": data["text"], "L": L, "layers": layers, **info}
