"""Which code a record came from; no dependencies beyond the standard library, so the GPU
benchmarks (run without the harness's packages) share it with the harness."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_revision(explicit: str | None) -> str:
    """``explicit`` (``--rev`` / ``git_rev``), else $S2O_GIT_REV, else ``git rev-parse HEAD``,
    else ``"unknown"``. Pass it explicitly on a machine that got a copy of the tree: a copied
    ``.git`` can name an older commit."""
    if explicit:
        return explicit
    if os.environ.get("S2O_GIT_REV"):
        return os.environ["S2O_GIT_REV"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# What a run's numbers depend on besides its config: the code under these paths.
CODE_PATHS = ("s2o", "eval", "experiments", "run.py")


@functools.lru_cache(maxsize=8)
def code_revision(explicit: str | None) -> str:
    """The code a record comes from: :func:`git_revision`, plus ``+dirty.<hash>`` when files under
    :data:`CODE_PATHS` differ from that commit (the hash of ``git diff HEAD`` over them), so an
    uncommitted kernel change is a different revision too. Computed once per process."""
    rev = git_revision(explicit)
    if explicit or os.environ.get("S2O_GIT_REV") or rev == "unknown":
        return rev
    try:
        out = subprocess.run(
            ["git", "diff", "HEAD", "--", *CODE_PATHS],
            cwd=ROOT, capture_output=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return rev
    if out.returncode != 0 or not out.stdout:
        return rev
    return f"{rev}+dirty.{hashlib.sha256(out.stdout).hexdigest()[:12]}"


def is_tracked(path: Path) -> bool:
    """Whether git tracks ``path`` (False outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--error-unmatch", str(Path(path).resolve())],
            cwd=ROOT, capture_output=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0
