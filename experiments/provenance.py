"""Which code a record came from; no dependencies beyond the standard library, so the GPU
benchmarks (run without the harness's packages) share it with the harness."""

from __future__ import annotations

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
