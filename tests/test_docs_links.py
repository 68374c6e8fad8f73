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


# a repository path as docs/architecture.md names one: a top-level folder and what follows, or a
# root file; `{a,b}` alternatives, `<placeholder>`, `*` and `..` mark the rest as a pattern
TOP = (
    r"(?:s2o|eval|experiments|analysis|benchmarks|conf|tests|hydra_plugins|tools|results|docs"
    r"|\.ci)"
)
REPO_PATH = re.compile(rf"(?<![\w./-])({TOP}/[\w./{{}},<>*-]*|run\.py|README\.md|pyproject\.toml)")
BRACES = re.compile(r"\{([^{}]*)\}")


def _alternatives(path: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py``."""
    m = BRACES.search(path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",")
            for q in _alternatives(path[: m.start()] + alt + path[m.end():])]  # fmt: skip


def _checkable(path: str) -> str:
    """The part of ``path`` that names one file or folder: up to the folder that holds the first
    placeholder, ``*`` or ``..`` (``results/<kind>/x.json`` -> ``results``)."""
    path = path.rstrip(".,")
    marks = [i for i in (path.find("<"), path.find("*"), path.find("..")) if i >= 0]
    return path[: min(marks)].rsplit("/", 1)[0] if marks else path


def _missing_paths(page: Path) -> list[str]:
    return [f"{page.name}:{number}: {path}"
            for number, line in enumerate(page.read_text().splitlines(), 1)
            for raw in REPO_PATH.findall(line) for path in _alternatives(raw)
            if not (ROOT / _checkable(path)).exists()]  # fmt: skip


def test_every_repository_path_named_in_architecture_exists():
    """docs/architecture.md is the map of where things live ("where is X"): a path it names that
    is gone sends the reader nowhere."""
    page = ROOT / "docs" / "architecture.md"
    assert len(REPO_PATH.findall(page.read_text())) > 50, "the pattern finds too few paths"
    missing = _missing_paths(page)
    assert not missing, f"paths that do not exist: {missing}"


def test_the_path_check_reads_alternatives_and_patterns(tmp_path):
    page = tmp_path / "architecture.md"
    page.write_text(
        "`run.py` `experiments/{sweep,e2e}.py` `conf/kind/<kind>.yaml` `results/<k>/.../r.json`\n"
        "`benchmarks/*.py`, `s2o/hf.py`. `experiments/{sweep,gone}.py` (x `eval/nothing.py`)\n"
    )
    assert _missing_paths(page) == ["architecture.md:2: experiments/gone.py",
                                    "architecture.md:2: eval/nothing.py"]  # fmt: skip
