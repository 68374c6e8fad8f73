"""Q/K/V inputs of the operator study, by ``data.source``: synthetic | model | file.

Every source returns a list of layers ``(layer_id, q [B, Hq, L, D], k, v [B, Hkv, L, D])`` on the
requested device and dtype, plus a small description for the record.
"""

from __future__ import annotations

from pathlib import Path

import torch

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
    missing = [i for i in wanted if any(f"{n}.{i}" not in keys for n in "qkv")]
    if missing or not wanted:
        raise ValueError(f"{path}: layers {missing or wanted} not found; the file has {found}")
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


def load_layers(data: dict, model: dict | None, device, dtype) -> tuple[list[Layer], dict]:
    """Build or load the inputs described by the resolved ``data`` (and ``model``) config."""
    source = data["source"]
    if source == "synthetic":
        spec = spec_from_cfg(data)
        q, k, v = synthetic_qkv(spec, dtype=dtype, device=device)
        return [(0, q, k, v)], {"source": "synthetic"}
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
