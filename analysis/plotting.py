"""Matplotlib with fixed settings, so a figure rebuilt from the same records has the same bytes."""

from __future__ import annotations

from pathlib import Path

RC = {
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 8,
    "figure.dpi": 100,
    "savefig.dpi": 130,
    "path.simplify": True,
    "svg.hashsalt": "s2o",
    "image.interpolation": "nearest",
}


def setup():
    """``matplotlib.pyplot`` on the Agg backend with the project's fixed rcParams."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcdefaults()
    plt.rcParams.update(RC)
    return plt


def save(fig, path: Path) -> str:
    """Save without the software/date metadata that would change the bytes; returns the name."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"Software": None} if path.suffix == ".png" else {"Creator": None, "CreationDate": None}
    fig.savefig(path, metadata=meta)
    plt.close(fig)
    return path.name
