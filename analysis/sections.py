"""What every artifact of ``make_all`` returns: its files, sources, text and missing records."""

from __future__ import annotations

from dataclasses import dataclass, field


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
