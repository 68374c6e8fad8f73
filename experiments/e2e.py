"""Time to first token (paper Fig. 1, Fig. 4c): the prefill of a whole model with a method as its
prefill attention, and the breakdown of that time.

For every length in ``e2e.lengths`` (default: 8K, 16K, ... up to the model's context), one
prompt of that many tokens is prefilled (``model(ids, use_cache=True, logits_to_keep=1)``, what
``generate`` does before its first token) by:

- the dense model: Full through the plug-in with each SDPA backend of ``e2e.dense`` (default
  flash, FlashAttention-2, the paper's reference, and cuDNN), and the stock model (no plug-in,
  SDPA's own dispatch) when ``e2e.stock``;
- the job's method (``method=...``) and every entry of ``e2e.methods``: a name (the method's
  registered defaults) or a mapping ``{name: s2o, tau: 0.02}`` (other knobs, labelled
  ``s2o_tau0.02``). FlashPrefill has no default ``alpha``: an entry without one takes the model
  family's official value (:func:`model_knobs`), as ``method=flashprefill`` does. A label given
  twice is refused. Each row of a method keeps every knob it ran with (``knobs``: its defaults
  and the given ones), so a reader groups rows by knob without parsing labels.

Each prefill's time is the median of ``e2e.reps`` synchronized wall-clock runs (the upper median
for an even count: the time of one run, the run whose breakdown is recorded); ``e2e.warmup``
untimed prefills at the first length warm each configuration up, and at every length the method
first runs once on random Q/K/V of one layer's shape (Triton specializes some launch parameters on
the length, cuDNN plans per shape: compilation stays out of the timing). The plug-in's CUDA events
split it into estimation, sparse attention (the selected layers), dense attention (sliding-window
layers), and the rest (projections, MLPs, norms, logits). The
attention bound is total / (total - selected layers' dense attention time) of the flash run: no
method that only changes those layers' attention can beat it. Inputs are Paul Graham's essays in
the model's tokens (``e2e.text=essays``), random token ids (``random``; always for random
weights), or a text file. A GGUF model runs the dense ``dtype`` weights transformers dequantizes
it to at load (the record's ``weights_format``). A length beyond the model's context (YaRN
included: :func:`eval.models.context`) is refused before the model loads.
"""

from __future__ import annotations

import statistics
import time

import torch
from tqdm.auto import tqdm

from eval import models
from eval.amdahl import amdahl_ms
from s2o.hf import head_shape, sparse_prefill
from s2o.methods import bind
from s2o.methods.full import check_backend_usable

from .common import ConfigError, JobContext, WandbLogger

CPU_MAX_LEN = 4096  # a CPU runs the plain-PyTorch reference: longer prefills take hours


def lengths(e2e: dict, model_cfg: dict) -> list[int]:
    """``e2e.lengths``, or powers of two from 8K up to the model's context
    (:func:`eval.models.context`: ``max_len``, extended by YaRN); a length beyond it is refused."""
    context, where = models.context(model_cfg)
    if e2e["lengths"]:
        out = [int(x) for x in e2e["lengths"]]
    else:
        top = int(context or 8192)
        out = [8192 * 2**i for i in range(20) if 8192 * 2**i <= top]
    bad = [x for x in out if x <= 0 or (context and x > context)]
    if bad:
        yarn = "; model.yarn=true turns YaRN on" if model_cfg.get("yarn") is False else ""
        raise ConfigError(
            f"e2e.lengths {bad} outside 1..{context}: the context of model "
            f"{model_cfg.get('name', '?')} ({where}){yarn}"
        )
    return out


def prompt_ids(e2e: dict, model_cfg: dict, tokenizer, length: int, seed: int) -> torch.Tensor:
    text = e2e["text"]
    if text == "random" or tokenizer is None:
        vocab = int(e2e.get("vocab") or 32000)
        g = torch.Generator().manual_seed(seed)
        return torch.randint(10, vocab, (1, length), generator=g)
    from eval import texts

    body = texts.paul_graham_essays(e2e["cache_dir"]) if text == "essays" else open(text).read()
    return torch.tensor(texts.token_ids(tokenizer, body, length))[None]


def _timed(model, ids: torch.Tensor, reps: int, sync) -> list[float]:
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure(model, ids, method: str | None, knobs: dict, e2e: dict, sync, warmup: int) -> dict:
    """One configuration at one length: median total and the plug-in's breakdown of that run."""
    reps = int(e2e["reps"])  # >= 1: checked with the config (experiments.common.MINIMUMS)
    if method is None:  # the stock model, no plug-in
        for _ in range(warmup):
            model(ids, use_cache=True, logits_to_keep=1)
        times = _timed(model, ids, reps, sync)
        return {"total_ms": statistics.median_high(times), "wall_ms": times}
    with sparse_prefill(model, method, **knobs) as run:
        for _ in range(warmup):
            model(ids, use_cache=True, logits_to_keep=1)
        warm_kernels(model, run, ids.shape[1])
        run.reset()
        times = _timed(model, ids, reps, sync)
        prefills = run.finalize()
    # the median run (the upper one for an even count): its breakdown and its wall time, so the
    # parts and the total come from the same prefill
    mid = sorted(range(reps), key=lambda i: times[i])[reps // 2]
    out = prefills[mid].summary()
    out.update(total_ms=times[mid], wall_ms=times)
    return out


def warm_kernels(model, run, length: int) -> None:
    """Run the bound method once on random Q/K/V of one layer's shape at this length, so that
    compilation (Triton specializes some launch parameters on L; cuDNN builds a plan per shape)
    stays out of the timed prefills."""
    hq, hkv, d = head_shape(model)
    device, dtype = next(model.parameters()).device, model.dtype
    q = torch.randn(1, hq, length, d, device=device, dtype=dtype)
    k, v = (torch.randn(1, hkv, length, d, device=device, dtype=dtype) for _ in range(2))
    run.method(q, k, v)


def configurations(resolved: dict) -> list[tuple[str, str | None, dict]]:
    """``(label, method or None for stock, knobs)`` in measuring order, dense first."""
    e2e = resolved["e2e"]
    out = [(f"full_{b}", "full", {"backend": b}) for b in e2e["dense"]]
    if e2e["stock"]:
        out.append(("sdpa_stock", None, {}))
    own = resolved["method_name"]
    if own != "full":
        out.append((own, own, dict(resolved["method"])))
    for item in e2e["methods"] or []:
        if isinstance(item, str):
            if item not in (own, "full"):
                out.append((item, item, model_knobs(item, resolved.get("model"))))
            continue
        knobs = dict(item)  # {name: s2o, tau: 0.02}: a method with other knobs than its defaults
        name = knobs.pop("name", None)
        if not isinstance(name, str) or not knobs:
            raise ConfigError(
                f"e2e.methods entry {item!r}: give a method name, or a mapping with `name` and "
                "the knobs that differ from its defaults, e.g. {name: s2o, tau: 0.02}"
            )
        label = name + "_" + "_".join(f"{k}{v}" for k, v in sorted(knobs.items()))
        out.append((label, name, {**model_knobs(name, resolved.get("model"), knobs), **knobs}))
    labels = [c[0] for c in out]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:  # a label names one configuration's rows (the analysis reads rows by label)
        raise ConfigError(
            f"e2e: configuration(s) {twice} given twice (e2e.dense, method= and e2e.methods "
            "together): give each once"
        )
    return out


def model_knobs(method: str, model_cfg: dict | None, given: dict | None = None) -> dict:
    """Knobs an ``e2e.methods`` entry takes from the model besides its registered defaults:
    FlashPrefill's ``alpha``, which has none, is the official value of the model's family
    (``model.arch.model_type``), as ``conf/method/flashprefill.yaml`` resolves it for
    ``method=flashprefill``; a family without one is a :class:`ConfigError` unless the entry gives
    ``alpha``."""
    if method != "flashprefill" or "alpha" in (given or {}):
        return {}
    from s2o.methods.flashprefill import official_alpha

    model_type = ((model_cfg or {}).get("arch") or {}).get("model_type")
    try:
        return {"alpha": official_alpha(model_type)}
    except ValueError as exc:
        name = (model_cfg or {}).get("name")
        raise ConfigError(
            f"e2e.methods: flashprefill on model={name}: {exc}, e.g. "
            "{name: flashprefill, alpha: 0.18}"
        ) from None


def evaluate(resolved: dict) -> dict:
    device = torch.device(resolved["device"])
    e2e, model_cfg = resolved["e2e"], models.normalize(resolved["model"] or {})
    if not resolved.get("model"):
        raise ValueError(
            "kind=e2e needs a model: model=gemma3_270m | smollm2_135m | llama31_8b ..."
        )
    model_cfg["dtype"] = resolved["dtype"]  # the harness's dtype (auto: bf16 on CUDA, fp32 on CPU)
    Ls = lengths(e2e, model_cfg)
    if device.type == "cpu" and max(Ls) > CPU_MAX_LEN:
        raise ConfigError(
            f"kind=e2e times prefill on a GPU; on the CPU the methods run their plain-PyTorch "
            f"reference, where e2e.lengths up to {max(Ls)} would take hours: run it on a GPU, or "
            f"give e2e.lengths of at most {CPU_MAX_LEN} tokens here (or dry_run=true)"
        )
    probe = torch.empty(1, 1, 1, 8, device=device)
    for backend in e2e["dense"]:
        try:  # before the model loads: a dense backend this device has no kernel for
            check_backend_usable(backend, probe, probe, probe)
        except ValueError as exc:
            raise ConfigError(
                f"e2e.dense={list(e2e['dense'])} on {device.type}: {exc}; on the CPU give "
                f"e2e.dense=[flash] or [math]"
            ) from None
    ran_with = {}  # label -> every knob it runs with (defaults and given), kept in its rows
    for label, method, knobs in configurations(resolved):  # bad knobs fail before the load
        if method is not None:
            try:
                ran_with[label] = dict(bind(method, **knobs).config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"e2e configuration {label}: {exc}") from None
    model, tok = models.load(model_cfg, device, seed=resolved["seed"])
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if tok is None:
        e2e = {**e2e, "vocab": model.config.get_text_config().vocab_size}
    rows = []
    grid = [(c, L) for c in configurations(resolved) for L in Ls]
    with torch.inference_mode():
        for (label, method, knobs), L in tqdm(grid, desc="e2e", disable=not resolved["progress"]):
            ids = prompt_ids(e2e, model_cfg, tok, L, resolved["seed"]).to(device)
            warmup = int(e2e["warmup"]) if L == Ls[0] else 0
            try:
                row = measure(model, ids, method, knobs, e2e, sync, warmup)
            except torch.OutOfMemoryError as exc:
                row = {"error": f"OutOfMemoryError: {str(exc).splitlines()[0]}"}
                torch.cuda.empty_cache()
            rows.append({"label": label, "L": L, **row})
            if label in ran_with:
                rows[-1]["knobs"] = ran_with[label]
    derive(rows)
    return {
        "model": models.describe(model_cfg),
        "weights": model_cfg["weights"],
        "weights_format": models.weights_format(model_cfg),  # GGUF: dense dtype weights, timed
        "text": "random token ids" if tok is None or e2e["text"] == "random" else e2e["text"],
        "dtype": model_cfg["dtype"],
        "rows": rows,
    }


def derive(rows: list[dict]) -> None:
    """Speedups against flash and cuDNN at the same length, and the attention bound."""
    by = {(r["L"], r["label"]): r for r in rows}
    for r in rows:
        flash, cudnn = by.get((r["L"], "full_flash"), {}), by.get((r["L"], "full_cudnn"), {})
        if "total_ms" not in r or "total_ms" not in flash:
            continue
        r["speedup_vs_flash"] = flash["total_ms"] / r["total_ms"]
        if "total_ms" in cudnn:
            r["speedup_vs_cudnn"] = cudnn["total_ms"] / r["total_ms"]
        attn = flash.get("sparse_attention_ms")
        if attn is not None and flash["total_ms"] > attn:
            r["attention_bound_vs_flash"] = flash["total_ms"] / (flash["total_ms"] - attn)
            if r.get("density") is not None and r["label"] not in ("full_flash", "full_cudnn"):
                r["amdahl_bound_vs_flash"] = flash["total_ms"] / amdahl_ms(flash, r["density"])
                r["share_of_amdahl"] = r["speedup_vs_flash"] / r["amdahl_bound_vs_flash"]


def table(metrics: dict) -> str:
    f = lambda x, s=".1f": "-" if x is None else format(x, s)
    lines = [
        f"{metrics['model']}, {metrics['text']}",
        f"{'config':<14}{'L':>7} {'density':>8} {'est':>8} {'sparse':>9} {'dense':>9} "
        f"{'rest':>9} {'total_ms':>10} {'vs_flash':>9} {'vs_cudnn':>9} {'bound':>6}",
    ]
    for r in metrics["rows"]:
        if "error" in r:
            lines.append(f"{r['label']:<14}{r['L']:>7}  {r['error']}")
            continue
        lines.append(
            f"{r['label']:<14}{r['L']:>7} {f(r.get('density'), '.3f'):>8} "
            f"{f(r.get('estimate_ms')):>8} {f(r.get('sparse_attention_ms')):>9} "
            f"{f(r.get('dense_attention_ms')):>9} {f(r.get('rest_ms')):>9} "
            f"{f(r['total_ms']):>10} {f(r.get('speedup_vs_flash'), '.2f'):>9} "
            f"{f(r.get('speedup_vs_cudnn'), '.2f'):>9} "
            f"{f(r.get('attention_bound_vs_flash'), '.2f'):>6}"
        )
    return "\n".join(lines)


def run(cfg, resolved: dict, ctx: JobContext, logger: WandbLogger) -> dict:
    metrics = evaluate(resolved)
    print(table(metrics))
    for i, r in enumerate(metrics["rows"]):
        logger.log({f"{r['label']}/total_ms": r.get("total_ms")}, step=i)
    return metrics
