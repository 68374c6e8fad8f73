"""Our FlashPrefill against the official v1 code (issue 36): the same block sets, the same output?

The official code (qhfan/FlashPrefill, ``ops/flashprefill_native_forward.py``; no license, so
nothing of it is committed here) is imported at run time from ``--official <folder containing
ops/>``. Per head shape, length and alpha, on the harness's synthetic Q/K/V
(:func:`benchmarks.common.make_qkv`) in the model dtype:

* **Block sets.** The official selection, by its own functions in its forward's order
  (``compute_mean_vector``, ``compute_block_score``, ``normalize_scores``, ``deal_output_score``
  -> ``block_index [B, M, N, H], counts [B, M, H]``), against
  :func:`s2o.methods.flashprefill.flashprefill_plan` with the same knobs (our Triton and
  reference paths). Per row (batch, query tile, query head): the share of identical block sets,
  the Jaccard index (mean, min), the rows that differ, the blocks only one side keeps, both
  densities (kept / causal blocks), and how far the differing blocks sat from the threshold
  (``|score / row max - alpha|`` by each side's own scores: ~1e-3 is rounding, not a rule).
* **Outputs.** The official ``flash_prefill`` against ``s2o.sparse_attention("flashprefill")``
  and against our block-sparse kernel on the official block sets (the kernel alone), and each
  against dense causal SDPA in the same dtype; the yardstick is dense SDPA against dense fp32.
  ``rel`` is ``||a - b|| / ||b||`` with ``b`` the second name (``official_vs_ours``: ours).

Knobs (ours -> the official argument): ``block_size``, ``sink_blocks`` -> ``attention_sink``,
``local_blocks`` -> ``window_size``, ``dense_tail_tiles`` -> ``last_n_block_full``,
``min_budget``; both sides at their default ``1/sqrt(D)`` scale.

The official module imports ``fla.utils`` (``autocast_custom_fwd``, ``contiguous``) from
flash-linear-attention. Where ``fla`` is not importable, :func:`fla_stand_in` (two decorators of
ours) sits in ``sys.modules`` for the import only; ``config.official.fla`` says which was used.

    python -m benchmarks.faithfulness_flashprefill --official local/fp_official --rev <sha> \\
        --out results/benchmarks            # GPU: 12/2 and 32/8 heads, 8K and 32K, bf16
    python -m benchmarks.faithfulness_flashprefill --official <fake> --smoke --out /tmp/b

``--smoke``: CPU, fp32, tiny shapes with 16-token blocks and our reference path only; the tests
run it against a fake official module (tests/test_faithfulness_flashprefill.py). The record goes
to ``<out>/faithfulness_flashprefill/<id>/record.json``; ``python -m analysis.faithfulness
<record.json>`` renders it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import sys
import time
import types
from pathlib import Path

import torch

from benchmarks import common

BENCHMARK = "faithfulness_flashprefill"
OFFICIAL_FILE = Path("ops/flashprefill_native_forward.py")
OFFICIAL_NAMES = ("compute_mean_vector", "compute_block_score", "normalize_scores",
                  "deal_output_score", "flash_prefill")  # fmt: skip
KNOBS = {"block_size": 128, "sink_blocks": 2, "local_blocks": 4, "dense_tail_tiles": 2,
         "min_budget": 0}  # fmt: skip
SMOKE = {"shapes": "2/1,4/2", "head_dim": 16, "lengths": "184,400", "block_size": 16}


# ----------------------------------------------------------------------------- the official code


def fla_stand_in() -> types.ModuleType:
    """A minimal ``fla`` package whose ``fla.utils`` holds the two decorators the official module
    imports: ``autocast_custom_fwd``, a pass-through (the check runs outside autocast), and
    ``contiguous``, which makes tensor arguments contiguous before the call (a non-contiguous
    ``out`` would be copied and its result lost: the script passes contiguous ones)."""

    def autocast_custom_fwd(fn):
        return fn

    def contiguous(fn):
        def dense(x):
            return x.contiguous() if isinstance(x, torch.Tensor) else x

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return fn(*map(dense, args), **{n: dense(x) for n, x in kwargs.items()})

        return call

    utils = types.ModuleType("fla.utils")
    utils.autocast_custom_fwd, utils.contiguous = autocast_custom_fwd, contiguous
    fla = types.ModuleType("fla")
    fla.__path__ = []  # a package, so that ``fla.utils`` resolves as its submodule
    fla.utils = utils
    return fla


def official_file(root: str | Path) -> Path:
    """``<root>/ops/flashprefill_native_forward.py``; ``SystemExit`` naming ``root`` otherwise."""
    root = Path(root)
    if not root.is_dir():
        raise SystemExit(f"--official {root}: no such folder (give the folder that holds ops/)")
    path = root / OFFICIAL_FILE
    if not path.is_file():
        inside = (root / OFFICIAL_FILE.name).is_file()
        hint = " (that is the ops/ folder itself: give its parent)" if inside else ""
        raise SystemExit(f"--official {root}: there is no {OFFICIAL_FILE} in it{hint}")
    return path


def load_official(path: Path) -> tuple[types.ModuleType, bool]:
    """Import the official module from ``path``; returns ``(module, stand_in_used)``. The
    stand-in, when used, leaves ``sys.modules`` as it found it."""
    use_stand_in = importlib.util.find_spec("fla") is None
    names = ("fla", "fla.utils")
    saved = {n: sys.modules[n] for n in names if n in sys.modules}  # a None entry blocks it
    if use_stand_in:
        fla = fla_stand_in()
        sys.modules.update({"fla": fla, "fla.utils": fla.utils})
    name = f"_official_flashprefill_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton and torch.compile look the source up by module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise SystemExit(f"--official: importing {path} failed: {exc!r}") from exc
    finally:
        if use_stand_in:
            for n in names:
                sys.modules.pop(n, None)
            sys.modules.update(saved)
    missing = [n for n in OFFICIAL_NAMES if not hasattr(module, n)]
    if missing:
        raise SystemExit(f"--official: {path} has no {', '.join(missing)}")
    return module, use_stand_in


def official_selection(mod, q, k, alpha: float, knobs: dict):
    """The official block sets by its own functions, in its forward's order, with its arguments.

    Args:
        q: ``[B, L, Hq, D]``, k: ``[B, L, Hkv, D]`` contiguous (the official layout).
    Returns:
        ``block_index [B, M, N, H]`` (kept blocks first, ascending, then ``N``), ``counts [B, M,
        H]`` and the normalized scores ``[B, M, N, H]`` fp32 (copies: ``deal_output_score`` is
        compiled with CUDA graphs, whose outputs the next call overwrites).
    """
    B, L, Hq, D = q.shape
    Hkv, bs = k.shape[2], knobs["block_size"]
    nb = -(-L // bs)
    mean_k = torch.empty(B, nb, Hkv, D, dtype=k.dtype, device=k.device)
    mod.compute_mean_vector[(nb, B * Hkv, 1)](k, mean_k, *k.stride(), *mean_k.stride(), Hkv, L,
                                              bs, D)  # fmt: skip
    score = torch.full((B, nb, nb, Hq), float("-inf"), dtype=torch.float32, device=q.device)
    peak = torch.full_like(score, float("-inf"))
    mod.compute_block_score[(nb, B * Hq, 1)](
        q, mean_k, 1 / (D**0.5), score, peak, *q.stride(), *mean_k.stride(), *score.stride(),
        *peak.stride(), Hq, Hkv, L, nb, bs, K_STRIDE=bs, D_HEAD=D,
    )  # fmt: skip
    normalized = mod.normalize_scores(score, peak).clone()
    rule = (knobs["sink_blocks"], knobs["local_blocks"], alpha, knobs["dense_tail_tiles"],
            knobs["min_budget"])  # fmt: skip
    index, counts = mod.deal_output_score(normalized, *rule)
    return index.clone(), counts.clone(), normalized


def official_output(mod, q, k, v, alpha: float, knobs: dict) -> torch.Tensor:
    """The official ``flash_prefill`` on ``[B, L, H, D]`` inputs -> ``[B, L, Hq, D]`` (written into
    a NaN-filled buffer, so rows it never wrote show)."""
    out = torch.full_like(q, float("nan"))
    mod.flash_prefill(q, k, v, out, knobs["block_size"], knobs["sink_blocks"],
                      knobs["local_blocks"], alpha, knobs["dense_tail_tiles"],
                      knobs["min_budget"])  # fmt: skip
    return out


# ----------------------------------------------------------------------------- comparisons


def mask_from_index(index: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``block_index [B, M, N, H]`` (the first ``counts [B, M, H]`` entries of each row are its
    blocks; the rest is padding) -> ``[B, H, M, N]`` bool, our plans' layout."""
    B, M, N, H = index.shape
    slot = torch.arange(N, device=index.device).view(1, 1, N, 1)
    idx = torch.where(slot < counts[:, :, None, :], index.long(), N)  # padding -> spare column
    mask = torch.zeros(B, M, N + 1, H, dtype=torch.bool, device=index.device)
    mask.scatter_(2, idx, True)
    return mask[:, :, :N].permute(0, 3, 1, 2).contiguous()


def compare_masks(ours: torch.Tensor, official: torch.Tensor) -> dict:
    """Per-row block sets of two ``[..., M, N]`` bool masks (rows: every leading index and query
    tile): identical share, Jaccard (1 for two empty rows), differing rows, blocks only one side
    keeps, densities (kept / causal blocks) and blocks above the diagonal (expected 0)."""
    from s2o.methods.blocksparse import block_causal

    a, b = ours.flatten(0, -3), official.flatten(0, -3)
    inter, union = (a & b).sum(-1).double(), (a | b).sum(-1).double()
    jac = torch.where(union > 0, inter / union.clamp(min=1), 1.0)
    causal = block_causal(a.shape[-1], a.device)
    n_causal = a.shape[0] * int(causal.sum())
    same = (a == b).all(-1)
    return {
        "rows": same.numel(),
        "exact_share": float(same.double().mean()),
        "rows_differ": int((~same).sum()),
        "jaccard_mean": float(jac.mean()),
        "jaccard_min": float(jac.min()),
        "density_ours": int(a.sum()) / n_causal,
        "density_official": int(b.sum()) / n_causal,
        "only_ours": int((a & ~b).sum()),
        "only_official": int((b & ~a).sum()),
        "above_diagonal": int(((a | b) & ~causal).sum()),
    }


def threshold_margin(scores: torch.Tensor, differ: torch.Tensor, alpha: float) -> float | None:
    """The largest ``|score / row max - alpha|`` among the ``differ`` blocks (``[..., N]`` scores
    and bool mask); ``None`` when no block differs."""
    if not bool(differ.any()):
        return None
    ratio = scores / scores.amax(-1, keepdim=True)
    return float((ratio - alpha).abs()[differ].max())


def errors(a: torch.Tensor, b: torch.Tensor) -> dict:
    """``max_abs`` and ``rel = ||a - b|| / ||b||`` (fp32)."""
    a, b = a.float(), b.float()
    return {"max_abs": float((a - b).abs().max()), "rel": float((a - b).norm() / b.norm())}


# ----------------------------------------------------------------------------- one case


def our_plan(q, k, alpha: float, knobs: dict, impl: str):
    from s2o.methods.flashprefill import flashprefill_plan

    return flashprefill_plan(q, k, alpha=alpha, scale=None, impl=impl, **knobs)


def compare_blocks(mod, q, k, alpha: float, knobs: dict, impls: list[str]) -> tuple[dict, object]:
    """Block sets of each of our paths against the official ones (``q, k`` as ``[B, H, L, D]``);
    returns ``(metrics, official mask [B, Hq, M, N])``."""
    from s2o.methods.flashprefill import tile_scores

    index, counts, official_scores = official_selection(
        mod, q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), alpha, knobs
    )
    official = mask_from_index(index, counts)
    official_scores = official_scores.permute(0, 3, 1, 2)
    ours_scores = tile_scores(q, k, block_size=knobs["block_size"], scale=q.shape[-1] ** -0.5)
    out = {"official_index_consistent": bool((official.sum(-1) == counts.permute(0, 2, 1)).all())}
    for impl in impls:
        ours = our_plan(q, k, alpha, knobs, impl).mask
        differ = ours ^ official
        out[impl] = {
            **compare_masks(ours, official),
            "margin_by_official_scores": threshold_margin(official_scores, differ, alpha),
            "margin_by_our_scores": threshold_margin(ours_scores, differ, alpha),
        }
    return out, official


def compare_outputs(mod, q, k, v, alpha: float, knobs: dict, official_mask, dense) -> dict:
    """The official output against ours, our kernel on its blocks, and dense (``[B, H, L, D]``)."""
    import s2o
    from s2o.methods.blocksparse import BlockPlan, attend

    blhd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    official = official_output(mod, *blhd, alpha, knobs).transpose(1, 2)
    ours, _ = s2o.sparse_attention("flashprefill", q, k, v, alpha=alpha, **knobs)
    plan = BlockPlan(official_mask, knobs["block_size"])
    kernel_alone, _ = attend(q, k, v, plan, scale=None, impl="auto")
    return {
        "official_nan": int(official.isnan().sum()),
        "official_vs_ours": errors(official, ours),
        "official_vs_ours_on_official_blocks": errors(official, kernel_alone),
        "official_vs_dense": errors(official, dense),
        "ours_vs_dense": errors(ours, dense),
    }


def dense_pair(q, k, v) -> tuple[torch.Tensor, dict]:
    """Dense causal SDPA in the inputs' dtype, and its error against fp32 (the yardstick)."""
    from s2o.methods.full import full_attention

    dense = full_attention(q, k, v)
    backend = "efficient" if q.is_cuda else "math"  # FlashAttention has no fp32 kernel
    exact = full_attention(q.float(), k.float(), v.float(), backend=backend)
    return dense, errors(dense, exact)


# ----------------------------------------------------------------------------- command line


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"12/2,32/8"`` -> ``[(12, 2), (32, 8)]``; ``SystemExit`` naming a bad entry."""
    shapes = []
    for item in text.split(","):
        try:
            hq, hkv = (int(x) for x in item.split("/"))
        except ValueError:
            raise SystemExit(f"--shapes: {item!r} is not <query heads>/<KV heads>") from None
        if hkv <= 0 or hq % hkv:
            raise SystemExit(f"--shapes: {item!r}: query heads must be a multiple of KV heads")
        shapes.append((hq, hkv))
    return shapes


def _numbers(flag: str, text: str, kind: type, low: float, high: float) -> list:
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: give comma-separated numbers") from None
    bad = [x for x in values if not low <= x <= high]
    if bad:
        raise SystemExit(f"{flag}: {bad} outside [{low}, {high}]")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from s2o.methods.flashprefill import OFFICIAL_ALPHA

    alphas = ",".join(str(OFFICIAL_ALPHA[f]) for f in ("qwen2", "llama"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official", required=True, help="the folder holding ops/ (not committed)")
    ap.add_argument("--shapes", default=None, help="query/KV heads, comma-separated (12/2,32/8)")
    ap.add_argument("--head-dim", type=int, default=None, help="default 128 (smoke: 16)")
    ap.add_argument("--lengths", default=None, help="tokens, comma-separated (8192,32768)")
    ap.add_argument("--alphas", default=alphas, help="official per-family alphas by default")
    ap.add_argument("--block-size", type=int, default=None, help="default 128 (smoke: 16)")
    ap.add_argument("--input", choices=sorted(common.INPUTS), default="calibrated",
                    help="calibrated: FlashPrefill prunes (on synthetic: keeps all)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eager", action="store_true",
                    help="run the official torch.compile'd selection uncompiled")  # fmt: skip
    ap.add_argument("--out", default="results/benchmarks")
    ap.add_argument("--rev", default=None, help="git revision (a copied tree may have no .git)")
    ap.add_argument("--smoke", action="store_true", help="CPU, fp32, tiny shapes (plumbing only)")
    args = ap.parse_args(argv)
    gpu = {"shapes": "12/2,32/8", "head_dim": 128, "lengths": "8192,32768", "block_size": 128}
    for name, value in (SMOKE if args.smoke else gpu).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.shapes = parse_shapes(args.shapes)
    args.lengths = _numbers("--lengths", args.lengths, int, 1, 1 << 22)
    args.alphas = _numbers("--alphas", args.alphas, float, 0.0, 1.0)
    return args


def _table(rows: list[dict], impl: str) -> str:
    head = f"{'heads':>6} {'L':>6} {'alpha':>5} {'same':>6} {'jac':>6} {'jmin':>6} "
    head += f"{'d_off':>6} {'d_ours':>6} {'differ':>6} {'off~ours':>9} {'off~dense':>9}"
    lines = [head]
    for r in rows:
        b, o = r["blocks"][impl], r["outputs"]
        lines.append(
            f"{r['heads']:>6} {r['L']:>6} {r['alpha']:>5} {b['exact_share']:>6.4f} "
            f"{b['jaccard_mean']:>6.4f} {b['jaccard_min']:>6.4f} {b['density_official']:>6.4f} "
            f"{b['density_ours']:>6.4f} {b['rows_differ']:>6} "
            f"{o['official_vs_ours']['rel']:>9.2e} {o['official_vs_dense']['rel']:>9.2e}"
        )
    return "\n".join(lines)


def _device(args) -> torch.device:
    if args.smoke:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.faithfulness_flashprefill needs a CUDA GPU (the official "
                         "Triton kernels); --smoke runs the plumbing on the CPU")  # fmt: skip
    return torch.device("cuda")


def main(argv: list[str] | None = None) -> dict:
    from experiments.provenance import is_tracked
    from experiments.records import benchmark_record_path, write_record

    t0 = time.perf_counter()
    args = parse_args(argv)
    path = official_file(args.official)
    device = _device(args)
    mod, stand_in = load_official(path)
    if args.eager:
        torch._dynamo.config.disable = True  # the official normalize/deal functions run as Python
    knobs = {**KNOBS, "block_size": args.block_size}
    dtype = "float32" if args.smoke else "bfloat16"
    impls = ["reference"] if args.smoke else ["triton", "reference"]
    config = {
        "official": {"file": str(OFFICIAL_FILE), "fla": "stand-in" if stand_in else "installed",
                     "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]},
        "shapes": [f"{hq}/{hkv}" for hq, hkv in args.shapes], "head_dim": args.head_dim,
        "lengths": args.lengths, "alphas": args.alphas, "knobs": knobs, "impls": impls,
        "input": args.input, "seed": args.seed, "dtype": dtype, "device": device.type,
        "eager": args.eager, "smoke": args.smoke,
    }  # fmt: skip
    command = common.command_line("benchmarks.faithfulness_flashprefill", argv)
    head = common.record_head(BENCHMARK, config, command, device, args.rev)
    out = benchmark_record_path(Path(args.out), BENCHMARK, head["id"])
    if out.exists() and is_tracked(out):
        raise SystemExit(f"{out} is a committed record: pass --out <another folder>")
    rec = {"status": "partial", **head, "metrics": {"rows": []}}
    rows = rec["metrics"]["rows"]
    for hq, hkv in args.shapes:
        shape = common.Shape(1, hq, hkv, args.head_dim, dtype, device.type)
        for L in args.lengths:
            common.free_memory()
            q, k, v = common.make_qkv(args.input, shape, L, args.seed)
            dense, yardstick = dense_pair(q, k, v)
            for alpha in args.alphas:
                blocks, official_mask = compare_blocks(mod, q, k, alpha, knobs, impls)
                outputs = compare_outputs(mod, q, k, v, alpha, knobs, official_mask, dense)
                row = {"heads": f"{hq}/{hkv}", "L": L, "alpha": alpha, "blocks": blocks,
                       "outputs": {**outputs, "dense_vs_fp32": yardstick}}  # fmt: skip
                rows.append(row)
                common.log(row)
                rec["elapsed_s"] = round(time.perf_counter() - t0, 3)
                write_record(out, rec)
            del q, k, v, dense
    rec["status"] = "ok"
    rec["elapsed_s"] = round(time.perf_counter() - t0, 3)
    write_record(out, rec)
    print(_table(rows, impls[0]))
    print(f"record: {out}")
    return rec


if __name__ == "__main__":
    main()
