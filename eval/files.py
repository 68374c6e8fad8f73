"""The content hash of a file, one home for every caller (run identities, GGUF tokenizer caches)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def sha256(path: str | Path) -> str:
    """The sha256 (hex) of the file at ``path``, read in 16 MB chunks; computed once per process
    while the file's size and modification time stay the same (a 1.1 GB GGUF takes seconds)."""
    p = Path(path).resolve()
    st = p.stat()
    return _sha256(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()
