"""Markdown tables from one pandas DataFrame of records (no tabulate dependency).

``markdown(df, formats)`` writes a GitHub table: each column formatted by its ``formats`` entry (a
format spec such as ``".3f"`` or a callable), missing values (None/NaN) as ``-``, everything else
with ``str``. The output depends only on the frame, so a table rebuilt from the same records has
the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd


def _cell(value, fmt: str | Callable | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt is None:
        return str(value)
    if callable(fmt):
        return fmt(value)
    return format(value, fmt)


def markdown(df: pd.DataFrame, formats: dict[str, str | Callable] | None = None) -> str:
    """The rows of ``df`` as a markdown table (header = column names, no index)."""
    formats = formats or {}
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = [_cell(v, formats.get(c)) for c, v in zip(cols, row)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
