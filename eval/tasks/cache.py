"""A cache of generated benchmark samples, keyed by what the samples depend on (task, length,
tokenizer and template identity, seed, n, generator version, data files) and never by the method:
every method reads the same prompts."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path


def cache_key(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cached_samples(
    key: dict,
    build: Callable[[], list[dict]],
    cache_dir: str | Path | None,
) -> list[dict]:
    """``build()`` once per ``key``; stored as ``<cache_dir>/<benchmark>/<task>/<hash>.jsonl`` with
    the key beside it (``.key.json``). ``cache_dir=None`` disables the cache."""
    if cache_dir is None:
        return build()
    folder = Path(cache_dir) / str(key.get("benchmark", "misc")) / str(key.get("task", "misc"))
    h = cache_key(key)
    path, key_path = folder / f"{h}.jsonl", folder / f"{h}.key.json"
    if path.is_file() and key_path.is_file():
        stored = json.loads(key_path.read_text())
        lines = path.read_text(encoding="utf-8").splitlines()
        if stored == json.loads(json.dumps(key, default=str)) and len(lines) == stored.get(
            "n", len(lines)
        ):
            return [json.loads(line) for line in lines]
    samples = build()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(
        "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples), encoding="utf-8"
    )
    os.replace(tmp, path)  # atomic: a killed run never leaves a half-written cache entry
    key_path.write_text(json.dumps(key, sort_keys=True, default=str, indent=1))
    return samples


def file_identity(path: str | Path | None) -> str | None:
    """Name, size and modification time of a data file (cheap; changes when the file does)."""
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        return ";".join(f"{f.name}:{f.stat().st_size}" for f in sorted(p.iterdir()) if f.is_file())
    st = p.stat()
    return f"{p.resolve()}:{st.st_size}:{int(st.st_mtime)}"
