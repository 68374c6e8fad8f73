"""Every relative markdown link of README.md and docs/*.md points at a file or folder that exists
(relative to the page that holds the link; web links, mail links and pure #anchors are not
checked, and a #fragment is stripped)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from harness_util import ROOT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of each markdown link outside code blocks and code spans."""
    found, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            found += [(number, t) for t in LINK.findall(CODE_SPAN.sub("", line))]
    return found


def _broken(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of each relative link whose file does not exist."""
    broken = []
    for number, target in _links(page):
        target = target.strip("<>")
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / unquote(target.split("#", 1)[0])).exists():
            broken.append((number, target))
    return broken


def test_relative_links_of_readme_and_docs_resolve():
    assert any(_links(p) for p in _pages()), "no markdown link found: is the pattern right?"
    broken = [f"{p.relative_to(ROOT)}:{n}: {t}" for p in _pages() for n, t in _broken(p)]
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_check_catches_a_bogus_link_and_only_it(tmp_path):
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a) [web](https://example.org) [mail](mailto:a@b.c) [anchor](#b)\n"
        "`[code span](nope.md)`\n```\n[fenced](nope.md)\n```\n[bad](missing/nothing.md#c)\n"
    )
    assert len(_links(page)) == 5
    assert _broken(page) == [(6, "missing/nothing.md#c")]
