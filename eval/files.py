"""Files shared by every caller: a file's content hash (run identities, GGUF caches), a cache
folder written beside its final name and published by one rename, and a lock that lets one process
fill a cache entry while the others that want it wait."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
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


def staging_dir(folder: Path) -> Path:
    """An empty temporary sibling of ``folder``, named by process id, to fill before
    :func:`publish_dir` (a reader of ``folder`` never sees it half-written)."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_dir(tmp: Path, folder: Path, *, replace: bool = False) -> None:
    """Rename the filled ``tmp`` to ``folder``; ``replace``: an existing ``folder`` goes first.
    When another process published ``folder`` meanwhile (jobs sharing a GPU), its copy stands and
    ``tmp`` is removed."""
    if replace:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created, with its folder; never removed) for
    the block: processes sharing a cache (jobs of one node, pytest-xdist workers) fill an entry
    once instead of racing to write or fetch it. Released when the block ends or the process
    dies."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
