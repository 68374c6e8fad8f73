"""Matched sparsity (paper Fig. 4a and the 3.82x / 3.17x claims): every method on the same inputs.

For each method, its ``main_knob`` (from the registry) is bisected inside ``matched.ranges[method]``
until the sparsity reaches each ``matched.target_sparsity`` (within ``tol_sparsity``), and the MSE
there is reported; the reverse search finds the density at each ``matched.target_mse``. Every
evaluated knob value is kept as a curve point (knob, sparsity, density, MSE, MAE; the same per
layer under ``layers``), which is what the Fig. 4a plot draws. Methods not registered in
``s2o.METHODS`` are reported as skipped.
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from eval.data import load_layers
from s2o import METHODS
from s2o.methods import resolve_knobs

from . import operator
from .common import JobContext, WandbLogger, check_memory


class Curve:
    """Evaluations of one method at knob values, memoised."""

    def __init__(self, method: str, knobs: dict, layers, refs: dict, progress: bool):
        self.method, self.knobs, self.layers, self.refs = method, knobs, layers, refs
        self.points: dict[float, dict] = {}
        self.progress = progress

    def __call__(self, x: float) -> dict:
        if x not in self.points:
            knobs = {**self.knobs, METHODS[self.method].main_knob: x}
            ref = self.refs_for(knobs)
            m = operator.accuracy(self.method, knobs, self.layers, ref, progress=False)
            keys = ("sparsity", "density", "mse", "mae")
            # each layer's own point too: analysis/matched_points.py bootstraps over the layers
            layers = [{"layer": p["layer"], **{k: p[k] for k in keys}} for p in m["per_layer"]]
            self.points[x] = {"knob": x, **{k: m[k] for k in keys}, "layers": layers}
        return self.points[x]

    def refs_for(self, knobs: dict):
        key = repr(operator.full_knobs(knobs))
        if key not in self.refs:
            self.refs[key] = operator.references(self.layers, knobs, self.progress)
        return self.refs[key]


def _mid(lo: float, hi: float, log: bool) -> float:
    return math.sqrt(lo * hi) if log else 0.5 * (lo + hi)


def bisect(curve: Curve, key: str, target: float, lo: float, hi: float, increasing: bool,
           iters: int, tol: float, log: bool) -> dict:  # fmt: skip
    """Knob value whose ``key`` (sparsity or mse) is closest to ``target``; ``increasing`` tells
    whether ``key`` grows with the knob. Returns the closest evaluated point."""
    best = None
    for _ in range(iters):
        x = _mid(lo, hi, log)
        p = curve(x)
        if best is None or abs(p[key] - target) < abs(best[key] - target):
            best = p
        if abs(p[key] - target) <= tol:
            break
        if (p[key] < target) == increasing:
            lo = x
        else:
            hi = x
    for edge in (lo, hi):
        p = curve(edge)
        if abs(p[key] - target) < abs(best[key] - target):
            best = p
    return {"target": target, **best}


def validation_knobs(name: str, cfg: dict) -> dict:
    """The knobs checked before the inputs are built: the method's defaults, ``cfg.knobs``, and
    the main knob at the low end of its range (the search sets it at every point, so a method
    whose main knob has no default, FlashPrefill's alpha, needs none here)."""
    m = METHODS[name]
    knobs = {**m.defaults, **(cfg["knobs"].get(name) or {})}
    if name in (cfg.get("ranges") or {}):
        knobs[m.main_knob] = cfg["ranges"][name][0]
    return knobs


def match_method(name: str, cfg: dict, layers, refs: dict, progress: bool) -> dict:
    m = METHODS[name]
    knobs = {**m.defaults, **(cfg["knobs"].get(name) or {})}
    lo, hi = cfg["ranges"][name]
    log = lo > 0 and hi / lo >= 100
    curve = Curve(name, knobs, layers, refs, progress)
    for x in cfg["scan"].get(name) or []:
        curve(float(x))
    inc = m.sparsity_increases_with_knob
    common = dict(lo=lo, hi=hi, iters=cfg["iters"], log=log)
    at_sparsity = [
        bisect(curve, "sparsity", t, increasing=inc, tol=cfg["tol_sparsity"], **common)
        for t in cfg["target_sparsity"]
    ]
    at_mse = [
        bisect(curve, "mse", t, increasing=inc, tol=cfg["tol_mse_rel"] * t, **common)
        for t in cfg["target_mse"]
    ]
    points = sorted(curve.points.values(), key=lambda p: p["sparsity"])
    return {"status": "ok", "main_knob": m.main_knob, "knobs": knobs, "curve": points,
            "at_sparsity": at_sparsity, "at_mse": at_mse}  # fmt: skip


# a method counts at a target sparsity when its bisection ended this close to it (a knob range
# that cannot reach the target ends at its edge; comparing that point would not be "matched")
REACH_SPARSITY = 0.02


def ratios(results: dict, cfg: dict) -> dict:
    """Best baseline over S2O: MSE at each target sparsity, density at each target MSE. At a
    target sparsity only methods whose bisection reached it (within :data:`REACH_SPARSITY`) are
    compared; a target S2O did not reach has no ratio."""
    if results.get("s2o", {}).get("status") != "ok":
        return {}
    base = [r for n, r in results.items() if n != "s2o" and r["status"] == "ok"]

    def compare(targets, at, metric, reached):
        rows = []
        for i, t in enumerate(targets):
            ours = results["s2o"][at][i]
            vals = [b[at][i][metric] for b in base if reached(b[at][i], t)]
            best = min(vals, default=None)
            ok = reached(ours, t) and best is not None and ours[metric] > 0
            rows.append({"target": t, "s2o": ours[metric], "best_baseline": best,
                         "ratio": best / ours[metric] if ok else None})  # fmt: skip
        return rows

    def at_sparsity(p: dict, t: float) -> bool:
        return abs(p["sparsity"] - t) <= REACH_SPARSITY

    return {
        "mse_at_sparsity": compare(cfg["target_sparsity"], "at_sparsity", "mse", at_sparsity),
        "density_at_mse": compare(cfg["target_mse"], "at_mse", "density", lambda p, t: True),
    }


def run(cfg: DictConfig, resolved: dict, ctx: JobContext, logger: WandbLogger) -> dict:
    mcfg = resolved["matched"]
    for name in mcfg["methods"]:  # bad knobs fail before the inputs are built or captured
        if name in METHODS:
            resolve_knobs(name, validation_knobs(name, mcfg))
    check_memory(resolved)
    device, dtype = torch.device(resolved["device"]), getattr(torch, resolved["dtype"])
    layers, info = load_layers(
        resolved["data"], resolved.get("model"), device, dtype, resolved.get("input_cache")
    )
    refs: dict = {}
    results = {}
    for name in tqdm(mcfg["methods"], desc="methods", disable=not resolved["progress"]):
        if name not in METHODS:
            results[name] = {
                "status": "skipped",
                "reason": f"not registered; have {sorted(METHODS)}",
            }
            continue
        results[name] = match_method(name, mcfg, layers, refs, resolved["progress"])
        for p in results[name]["at_sparsity"]:
            logger.log({f"{name}/mse_at_sparsity_{p['target']}": p["mse"]})
    # the reach rule goes into the record: its readers apply it to the at_sparsity points
    out = {"methods": results, "ratios": ratios(results, mcfg), "reach_sparsity": REACH_SPARSITY,
           "data": info}  # fmt: skip
    _, q, k, _ = layers[0]
    out["shape"] = {"q": list(q.shape), "kv": list(k.shape), "layers": len(layers)}
    print(table(results))
    return out


def table(results: dict) -> str:
    lines = [
        f"{'method':<12} {'target':<10} {'knob':<10} {'sparsity':<9} {'MSE':<10} {'density':<8}"
    ]
    for name, r in results.items():
        if r["status"] != "ok":
            lines.append(f"{name:<12} {r['status']}: {r.get('reason', '')}")
            continue
        for p in r["at_sparsity"] + r["at_mse"]:
            lines.append(
                f"{name:<12} {p['target']:<10.4g} {p['knob']:<10.4g} {p['sparsity']:<9.4f} "
                f"{p['mse']:<10.3e} {p['density']:<8.4f}"
            )
    return "\n".join(lines)
