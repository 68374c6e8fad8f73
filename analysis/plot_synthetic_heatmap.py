"""Heatmap of the synthetic Q/K/V (eval/synthetic.py) for one head: scores and softmax.

The only script in analysis/ that computes something: it visualises the *input generator* so a user
can see the planted stripes; it does not touch results.

    python analysis/plot_synthetic_heatmap.py --L 2048 --head 0  # outputs/analysis/, git-ignored
    python analysis/plot_synthetic_heatmap.py --set sink=0 heavy=0   # switch structures off
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import torch

from analysis.records import SCRATCH
from eval.synthetic import SyntheticSpec, synthetic_qkv


def head_maps(spec: SyntheticSpec, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal scores ``q k^T / sqrt(D)`` and softmax probabilities ``[L, L]`` of one query head."""
    q, k, _ = synthetic_qkv(spec)
    group = spec.heads_q // spec.heads_kv
    s = q[0, head] @ k[0, head // group].T / math.sqrt(spec.head_dim)
    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s, s.softmax(dim=-1)


def max_pool(x: torch.Tensor, pixels: int) -> torch.Tensor:
    """Block max so one-token-wide stripes survive down-sampling to about ``pixels`` pixels."""
    f = max(1, -(-x.shape[0] // pixels))
    x = x.masked_fill(torch.isnan(x), float("-inf"))[None, None]
    pooled = torch.nn.functional.max_pool2d(x, f, ceil_mode=True)[0, 0]
    return pooled.masked_fill(torch.isinf(pooled), float("nan"))


def plot(spec: SyntheticSpec, head: int, out: Path, pixels: int = 512) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, p = head_maps(spec, head)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    shown = s.clone().masked_fill(torch.isinf(s), float("nan"))
    finite = s[torch.isfinite(s)]
    lo, hi = torch.quantile(
        finite[:: max(1, finite.numel() // 200_000)], torch.tensor([0.01, 0.999])
    )
    im0 = axes[0].imshow(
        max_pool(shown, pixels).numpy(),
        cmap="viridis",
        vmin=float(lo),
        vmax=float(hi),
        interpolation="nearest",
    )
    axes[0].set_title("scores q.k/sqrt(D)")
    fig.colorbar(im0, ax=axes[0], fraction=0.046)
    logp = torch.log10(p.clamp_min(1e-8)).masked_fill(torch.isinf(s), float("nan"))
    im1 = axes[1].imshow(
        max_pool(logp, pixels).numpy(), cmap="magma", vmin=-6, vmax=0, interpolation="nearest"
    )
    axes[1].set_title("log10 softmax probability")
    fig.colorbar(im1, ax=axes[1], fraction=0.046)
    for ax in axes:
        f = max(1, -(-spec.L // pixels))
        ax.set_xlabel(f"key position / {f}" if f > 1 else "key position")
        ax.set_ylabel(f"query position / {f} (max-pooled)" if f > 1 else "query position")
    knobs = ", ".join(
        f"{f}={getattr(spec, f)}" for f in ("sink", "heavy", "slash", "horizontal", "background")
    )
    fig.suptitle(f"synthetic Q/K/V, L={spec.L}, head {head}: {knobs}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--L", type=int, default=2048)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], help="spec overrides, e.g. sink=0 slash=6")
    ap.add_argument("--out", type=Path, default=SCRATCH / "synthetic_heatmap.png")
    args = ap.parse_args(argv)
    fields = {f.name: f.type for f in dataclasses.fields(SyntheticSpec)}
    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in fields:
            ap.error(f"unknown spec field {key!r}; valid: {sorted(fields)}")
        extra[key] = float(value) if fields[key] in (float, "float") else int(value)
    spec = SyntheticSpec(L=args.L, seed=args.seed, **extra)
    print(plot(spec, args.head, args.out))


if __name__ == "__main__":
    main()
