"""One panel for a whole accuracy page: accuracy against density, one point per method setting
and length: the page's pooled cells (``accuracy_tables``: the tasks that are not uninformative,
over the records that hold each of them), the points its generated pooled lines quote. The page's
grid (``accuracy_tables.figure``) has a panel per task and length."""

from __future__ import annotations

import re
from pathlib import Path

from analysis.accuracy_tables import _cells, _order, dense_floor
from analysis.plotting import save, setup

MARKERS = "osD^vP*X"


def pooled_points(recs: list[dict]) -> list[tuple[int, dict]]:
    """``(length, row)`` of every point of the pooled lines: each length's `full` and every row
    with an informative comparison against it."""
    fulls = sorted((r for r in recs if r["method"] == "full"),
                   key=lambda r: r["environment"]["time"], reverse=True)  # fmt: skip
    out = []
    for task, length, _, rows in _cells(recs, fulls, dense_floor()):
        if task != "all" or not any(x["ref"] for x in rows):
            continue
        for x in sorted(rows, key=_order):
            if x["ref"] or (x["cmp"] is not None and not x["cmp"].get("uninformative")):
                out.append((length, x))
    return out


def figure(recs: list[dict], out: Path) -> Path | None:
    """Accuracy (95% interval) vs mean density, colour by method setting, marker by length;
    None when no pooled point has a density."""
    points = [(n, x) for n, x in pooled_points(recs) if x["density"] is not None]
    if not points:
        return None
    setting = lambda x: re.sub(r" \[[0-9a-f]+\]$", "", x["label"])  # noqa: E731
    names = list(dict.fromkeys(setting(x) for _, x in points))
    lengths = sorted({n for n, _ in points}, key=lambda n: n or 0)
    plt = setup()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    for n, x in points:
        err = [[max(0.0, x["acc"] - x["lo"])], [max(0.0, x["hi"] - x["acc"])]]
        ax.errorbar([x["density"]], [x["acc"]], yerr=err, fmt=MARKERS[lengths.index(n) % 8],
                    ms=6, capsize=2, color=f"C{names.index(setting(x)) % 10}")  # fmt: skip
    for i, name in enumerate(names):
        ax.plot([], [], "o", color=f"C{i % 10}", label=name)
    for j, n in enumerate(lengths):
        k = len(next(x["pool"] for m, x in points if m == n))
        ax.plot([], [], MARKERS[j % 8], color="0.4", mfc="none",
                label=f"{n:,} tokens ({k} task{'s' * (k != 1)} pooled)")  # fmt: skip
    ax.set(xlim=(-0.03, 1.03), xlabel="mean prefill density", ylabel="accuracy %, tasks pooled")
    ax.grid(alpha=0.3)
    bench, model = recs[0]["metrics"]["benchmark"], recs[0]["config"]["model"]["name"]
    ax.set_title(f"{bench}, {model}: accuracy vs density (95% intervals)", fontsize=9)
    fig.legend(fontsize=7, loc="outside right center")
    save(fig, out)
    return out
