"""Shared by the fixed-data benchmarks: middle truncation in model tokens and line-numbered
reading of JSON lines."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def truncate_middle(tokenizer: Any, text: str, max_len: int | None) -> tuple[str, int, bool]:
    """Keep the first ``max_len // 2`` and the last ``max_len - max_len // 2`` tokens of ``text``
    (the official ``input[:max_len // 2] + input[-max_len // 2:]``), decoded back to text with
    special tokens skipped. Returns (text, tokens before truncation, truncated?)."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if max_len is None or len(ids) <= max_len:
        return text, len(ids), False
    kept = ids[: max_len // 2] + ids[len(ids) - (max_len - max_len // 2) :]
    return tokenizer.decode(kept, skip_special_tokens=True), len(ids), True


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a malformed line raises naming the file
    and the line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            yield lineno, obj


def check_fields(obj: dict, types: dict[str, tuple], where: str) -> None:
    """Raise naming ``where`` (file:line) when a field is missing or of the wrong type."""
    for name, allowed in types.items():
        if name not in obj:
            raise ValueError(f"{where}: missing field {name!r}")
        if not isinstance(obj[name], allowed):
            raise ValueError(
                f"{where}: field {name!r} is {type(obj[name]).__name__}, expected "
                + " or ".join(t.__name__ for t in allowed)
            )


def local_or_hub(
    local: Callable[[], list], hub: Callable[[], list], hint: str, n: int | None
) -> list:
    """The first ``n`` (all when None) rows from ``local`` when given, else from ``hub``; a hub
    failure raises ``FileNotFoundError`` with ``hint`` (what to download and where to set it)."""
    if local is not None:
        rows = local()
    else:
        try:
            rows = hub()
        except Exception as e:
            raise FileNotFoundError(f"{hint} (the hub failed: {e})") from e
    return rows if n is None else rows[:n]
