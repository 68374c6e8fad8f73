"""The operator study (paper Section 4.2): one method against Full on the same Q/K/V.

Accuracy: MSE and MAE of the method's output against ``s2o.sparse_attention('full', ...)``, per
head, averaged over heads, then over layers. Sparsity: ``AttentionStats.sparsity`` (1 - tiles
processed / dense causal tiles), averaged over layers. Latency, on the first layer: estimation
(the method's ``estimate``), attention (``attend`` with that plan), their total, Full, and the
speedups Full / total and Full / attention, all measured in the same process (``bench_ms``).
"""

from __future__ import annotations

import json

import torch
from tqdm.auto import tqdm

from eval.data import Layer, load_layers
from s2o import METHODS, sparse_attention
from s2o.methods import resolve_knobs

from .common import JobContext, WandbLogger, check_memory
from .records import data_fingerprint, model_fingerprint
from .timing import bench_ms


def full_knobs(knobs: dict) -> dict:
    """Full's knobs: its defaults, with the method's softmax scale when the method sets one."""
    out = dict(METHODS["full"].defaults)
    if knobs.get("scale") is not None:
        out["scale"] = knobs["scale"]
    return out


def references(layers: list[Layer], knobs: dict, progress: bool) -> list[torch.Tensor]:
    """Full attention output of every layer (the accuracy reference)."""
    fk = full_knobs(knobs)
    it = tqdm(layers, desc="full", disable=not progress or len(layers) < 2, leave=False)
    return [sparse_attention("full", q, k, v, **fk)[0] for _, q, k, v in it]


def accuracy(
    method: str, knobs: dict, layers: list[Layer], refs: list[torch.Tensor], progress: bool
) -> dict:
    """MSE/MAE against ``refs`` and sparsity, per layer and averaged."""
    per_layer, mse_heads = [], []
    it = tqdm(zip(layers, refs), total=len(layers), desc=method, leave=False,
              disable=not progress or len(layers) < 2)  # fmt: skip
    for (layer_id, q, k, v), ref in it:
        out, stats = sparse_attention(method, q, k, v, **knobs)
        err = out.float() - ref.float()
        mse_h = err.pow(2).mean(dim=(0, 2, 3)).double()
        mae_h = err.abs().mean(dim=(0, 2, 3)).double()
        mse_heads.append(mse_h)
        per_layer.append(
            {
                "layer": layer_id,
                "mse": float(mse_h.mean()),
                "mae": float(mae_h.mean()),
                "sparsity": stats.sparsity,
                "density": stats.density,
            }
        )
    mean = lambda key: sum(p[key] for p in per_layer) / len(per_layer)
    return {
        "mse": mean("mse"),
        "mae": mean("mae"),
        "sparsity": mean("sparsity"),
        "density": mean("density"),
        "per_layer": per_layer,
        "mse_per_head": torch.stack(mse_heads).mean(0).tolist(),
    }


def latency(method: str, knobs: dict, layer: Layer, device: torch.device, timing: dict) -> dict:
    """Estimation, attention, total and Full times (ms) on one layer, and the speedups."""
    _, q, k, v = layer
    m, mk = resolve_knobs(method, knobs)
    f, fk = resolve_knobs("full", full_knobs(knobs))
    plan = m.estimate(q, k, v, **mk)
    est = bench_ms(lambda: m.estimate(q, k, v, **mk), device, timing)
    att = bench_ms(lambda: m.attend(q, k, v, plan, **mk), device, timing)
    full = bench_ms(lambda: f.attend(q, k, v, None, **fk), device, timing)
    total = est + att
    return {
        "estimate_ms": est,
        "attention_ms": att,
        "total_ms": total,
        "full_ms": full,
        "speedup": full / total if total > 0 else None,
        "speedup_attention": full / att if att > 0 else None,
        "timer": "triton.testing.do_bench median" if device.type == "cuda" else "wall-clock median",
    }


def evaluate(resolved: dict, data_cache: dict | None = None) -> dict:
    """Metrics of one operator point; ``data_cache`` lets a sweep reuse inputs and references."""
    device, dtype = torch.device(resolved["device"]), getattr(torch, resolved["dtype"])
    method, knobs = resolved["method_name"], resolved["method"]
    resolve_knobs(method, knobs)  # a bad knob fails before the inputs are built or captured
    resolve_knobs("full", full_knobs(knobs))
    check_memory(resolved)
    # the files' content too (as in a record's identity): a data file, text or weights rewritten
    # between two points of one process are new inputs, not the cached ones
    data_key = json.dumps([resolved["data"], data_fingerprint(resolved), resolved.get("model"),
                           model_fingerprint(resolved), resolved["device"], resolved["dtype"]],
                          sort_keys=True)  # fmt: skip
    cache = data_cache if data_cache is not None else {}
    if cache.get("key") != data_key:
        cache.clear()
        layers, info = load_layers(
            resolved["data"], resolved.get("model"), device, dtype, resolved.get("input_cache")
        )
        cache.update(key=data_key, layers=layers, info=info, refs={})
    layers = cache["layers"]
    ref_key = json.dumps(full_knobs(knobs), sort_keys=True)
    if ref_key not in cache["refs"]:
        cache["refs"][ref_key] = references(layers, knobs, resolved["progress"])
    metrics = accuracy(method, knobs, layers, cache["refs"][ref_key], resolved["progress"])
    _, q, k, _ = layers[0]
    metrics["shape"] = {"q": list(q.shape), "kv": list(k.shape), "layers": len(layers)}
    metrics["data"] = cache["info"]
    if resolved["timing"]["enabled"]:
        metrics["latency"] = latency(method, knobs, layers[0], device, resolved["timing"])
    return metrics


def table(method: str, metrics: dict) -> str:
    """A short fixed-width summary of one operator point."""
    shape = metrics["shape"]
    lat = metrics.get("latency") or {}
    fmt = lambda x, spec: "-" if x is None else format(x, spec)
    head = "method    L       Hq/Hkv  layers  sparsity  MSE        MAE        "
    head += "est_ms    attn_ms   total_ms  full_ms   speedup"
    row = (
        f"{method:<9} {shape['q'][2]:<7} {shape['q'][1]}/{shape['kv'][1]:<5} {shape['layers']:<7} "
        f"{metrics['sparsity']:<9.4f} {metrics['mse']:<10.3e} {metrics['mae']:<10.3e} "
        f"{fmt(lat.get('estimate_ms'), '<9.2f')} {fmt(lat.get('attention_ms'), '<9.2f')} "
        f"{fmt(lat.get('total_ms'), '<9.2f')} {fmt(lat.get('full_ms'), '<9.2f')} "
        f"{fmt(lat.get('speedup'), '.2f')}"
    )
    return f"{head}\n{row}"


def scalars(metrics: dict) -> dict:
    """The numbers worth a W&B chart."""
    out = {k: metrics[k] for k in ("mse", "mae", "sparsity", "density")}
    for k, v in (metrics.get("latency") or {}).items():
        if isinstance(v, float):
            out[f"latency/{k}"] = v
    return out


# The last input (and its dense references) this process built: the points of a multirun that
# run in one process (the local launcher; node_gpus with reused workers) and share data, model,
# device and dtype build their input once. A 64K synthetic input takes tens of seconds on a CPU,
# more than a point's GPU work; on two H200s such host-bound points held an 8-point sweep to 1.57x
# over one GPU (results/launchers/). One entry: a point with other data replaces it.
PROCESS_DATA: dict = {}


def run(cfg, resolved: dict, ctx: JobContext, logger: WandbLogger) -> dict:
    metrics = evaluate(resolved, PROCESS_DATA)
    print(table(resolved["method_name"], metrics))
    logger.log(scalars(metrics))
    logger.summary(scalars(metrics))
    return metrics
