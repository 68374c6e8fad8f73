"""Shared by the fixed-data benchmarks: middle truncation in model tokens, line-numbered
reading of JSON lines, and whether a hub dataset can be had (:func:`hub_refusal`)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import urllib.error
import urllib.request
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


HUB_PROBE_TIMEOUT_S = 3.0  # one request, no retry: `datasets` itself retries for ~26 s offline


def hub_refusal(repo_id: str) -> str | None:
    """Why ``datasets.load_dataset(repo_id)`` cannot work on this machine, found without a retry,
    or None: no ``datasets`` package; else, unless the set is in the local Hugging Face cache
    (:func:`hub_cached`), the hub is offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) or
    does not answer one request (:func:`hub_unreachable`)."""
    if importlib.util.find_spec("datasets") is None:
        return "the `datasets` package is not installed"
    if hub_cached(repo_id):
        return None
    why = hub_unreachable()
    return f"{repo_id} is not in the local cache and the hub {why}" if why else None


def hub_cached(repo_id: str) -> bool:
    """Whether the hub dataset ``repo_id`` has a folder in this machine's caches: the hub's
    downloads (``HF_HUB_CACHE``) or ``datasets``'s prepared sets (``HF_DATASETS_CACHE``)."""
    from huggingface_hub import constants

    downloads = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    prepared = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    return downloads.is_dir() or (prepared / repo_id.replace("/", "___")).is_dir()


@functools.lru_cache(maxsize=1)  # a sweep's preflight asks once per point: one request in all
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (``"is offline (HF_HUB_OFFLINE is set)"``, ``"(<endpoint>)
    does not answer: <reason>"``), from the environment or one request with no retry; None when
    it answers (any HTTP status)."""
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").upper() in {"1", "ON", "YES", "TRUE"}:
            return f"is offline ({var} is set)"
    request = urllib.request.Request(constants.ENDPOINT, method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=HUB_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as e:
        return f"({constants.ENDPOINT}) does not answer: {getattr(e, 'reason', e)}"
    return None
