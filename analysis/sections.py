"""What every artifact of ``make_all`` reads and returns: the context (pinned records, output
folder, the paper's numbers), and its files, sources, text and missing records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    slug: str
    title: str
    paper: str
    body: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def missing_line(self, what: str, how: str) -> None:
        self.missing.append(f"**Missing records:** {what}. Produced by: {how}")


@dataclass
class Ctx:
    """What an artifact reads from: the results folder, the pins of ``results/manifest.yaml``
    and the paper's numbers; it writes its files into ``out``."""

    results: Path
    out: Path
    manifest: dict
    paper: dict

    def record(self, key: str) -> tuple[dict | list | None, str | None]:
        """``(parsed JSON, path relative to the repo)`` of ``records.<key>`` (dotted), or Nones."""
        node = self.manifest.get("records") or {}
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or not (self.results / node).is_file():
            return None, None
        return json.loads((self.results / node).read_text()), f"results/{node}"

    def experiment(self, name: str) -> dict | None:
        """The ok record pinned for experiment ``name`` (``experiments.<name>``), or None."""
        rel = (self.manifest.get("experiments") or {}).get(name)
        if rel is None or not (self.results / rel).is_file():
            return None
        rec = json.loads((self.results / rel).read_text())
        if rec.get("status") != "ok":
            return None
        rec["_path"] = f"results/{rel}"
        return rec


# the baselines every artifact that compares methods should hold (S2O and Full besides)
BASELINES = ("flexprefill", "xattn", "pbs", "flashprefill")


def missing_baselines(sec: Section, have: set[str], where: str, how: str) -> None:
    """A missing-records line for each baseline of :data:`BASELINES` that ``where`` lacks (the
    records were made before it joined), never a number in its place."""
    for m in BASELINES:
        if m not in have:
            sec.missing_line(f"{m} in {where}", how)
