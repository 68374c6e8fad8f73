"""The haystacks: real text that ships with this Python, never generated noise.

Three kinds, each a list of lines with the places where a window may start and the form a needle
takes in it:

- ``code``: the standard library's top-level ``*.py`` source files (``sysconfig``'s ``stdlib``
  folder), in name order, each after a ``# file: <name>`` line. A window starts at a file; a
  needle is a comment line (``# One of the special magic numbers ...``) after a blank line, at the
  indentation of the code below it.
- ``prose``: the Python Language Reference's topics that ship in ``pydoc_data.topics`` (what
  ``help("assert")`` prints), then the standard library's docstrings of 40 words or more (modules,
  classes, functions; files in name order, ``ast.walk`` order within a file). A window starts at a
  paragraph; a needle is a paragraph of its own, between two paragraphs.
- ``records``: the Unicode Character Database of ``unicodedata`` as JSON lines, one code point
  each (name, category, bidirectional class, combining class, mirrored, decomposition, numeric
  value, east-asian width); algorithmically named ranges (CJK ideographs, Hangul syllables,
  Tangut, ...) are left out: their names are a prefix and the code point. A window starts at any
  record; a needle is a record of its own, ``{"note": "One of the special magic numbers ..."}``.

What a haystack came from is its :func:`identity` (cheap: nothing is parsed): the source, the
Python version (and the Unicode version for ``records``) and the sha256 of the files read, so that
samples are deterministic given the installed Python and a cache entry made from another build is
never read. A missing
source (a Python without its ``.py`` files or without ``pydoc_data``) raises
:class:`HaystackSourceMissing` naming what is missing.
"""

from __future__ import annotations

import ast
import hashlib
import json
import platform
import sysconfig
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

KINDS = ("code", "prose", "records")
MIN_STDLIB_FILES = 100  # fewer top-level .py files: a stripped Python (only .pyc), refused
MIN_DOCSTRING_WORDS = 40
# Unicode names that are a prefix plus the code point (UAX #44's derived names): no content
_DERIVED_NAMES = ("CJK UNIFIED IDEOGRAPH-", "CJK COMPATIBILITY IDEOGRAPH-", "HANGUL SYLLABLE ",
                  "TANGUT IDEOGRAPH-", "KHITAN SMALL SCRIPT CHARACTER-",
                  "NUSHU CHARACTER-")  # fmt: skip


class HaystackSourceMissing(FileNotFoundError):
    """A haystack's source is not installed in this Python."""


@dataclass(frozen=True)
class Haystack:
    """One kind's text as lines.

    Attributes:
        kind: ``code``, ``prose`` or ``records``.
        lines: the whole source, one entry per line (no newline).
        starts: sorted line indices where a window may begin (a file, a paragraph, a record).
        lowered: ``"\\n".join(lines).lower()``: keys and values are drawn absent from it.
    """

    kind: str
    lines: tuple[str, ...]
    starts: tuple[int, ...]
    lowered: str

    def slots(self, window: list[str]) -> list[int]:
        """Indices ``i`` of ``window`` before which a needle may go: after a blank line (code,
        prose) or anywhere (records); 0 and ``len(window)`` always."""
        if self.kind == "records":
            return list(range(len(window) + 1))
        inner = [i for i in range(1, len(window)) if not window[i - 1].strip()]
        return [0, *inner, len(window)]

    def needle(self, sentence: str, below: str | None) -> list[str]:
        """The lines a needle ``sentence`` adds in this kind's form; ``below`` is the window's
        line that will follow it (None at the end)."""
        if self.kind == "code":
            indent = below[: len(below) - len(below.lstrip())] if below else ""
            return [f"{indent}# {sentence}"]
        if self.kind == "prose":  # after the window's last line, a blank line first
            return [sentence, ""] if below is not None else ["", sentence, ""]
        return [json.dumps({"note": sentence})]


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    folder = stdlib_dir()
    files = sorted(folder.glob("*.py"))
    if len(files) < MIN_STDLIB_FILES:
        raise HaystackSourceMissing(
            f"the code and prose haystacks read the standard library's .py sources, but {folder} "
            f"has {len(files)} (a Python installed without its sources?); use a Python with them"
        )
    return files


def check_source(kind: str) -> None:
    """Refuse, cheaply (nothing is read), a ``kind`` whose source this Python lacks."""
    if kind not in KINDS:
        raise ValueError(f"unknown haystack kind {kind!r}; known: {list(KINDS)}")
    if kind in ("code", "prose"):
        _stdlib_files()
    if kind == "prose":
        try:
            import pydoc_data.topics  # noqa: F401
        except ModuleNotFoundError as e:
            raise HaystackSourceMissing(
                "the prose haystack reads the Language Reference topics of the standard "
                "library's `pydoc_data` package, which this Python lacks (some distributions "
                "ship it apart, e.g. Debian's python3-doc); use a Python that has it"
            ) from e


def _code() -> tuple[list[str], list[int]]:
    lines, starts = [], []
    for f in _stdlib_files():
        starts.append(len(lines))
        lines += [f"# file: {f.name}", *f.read_text(encoding="utf-8").splitlines(), ""]
    return lines, starts


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, kinds))
    return [d for d in docs if d and len(d.split()) >= MIN_DOCSTRING_WORDS]


def _prose() -> tuple[list[str], list[int]]:
    from pydoc_data.topics import topics

    texts = [topics[name] for name in sorted(topics)]
    texts += [d for f in _stdlib_files() for d in _docstrings(f)]
    lines = []
    for text in texts:
        lines += [line.rstrip() for line in text.strip().splitlines()] + [""]
    starts = [i for i, line in enumerate(lines) if line and (i == 0 or not lines[i - 1])]
    return lines, starts


def _record(cp: int) -> dict | None:
    ch = chr(cp)
    name = unicodedata.name(ch, None)
    if name is None or name.startswith(_DERIVED_NAMES):
        return None
    rec = {"code_point": f"U+{cp:04X}", "name": name, "category": unicodedata.category(ch),
           "bidirectional": unicodedata.bidirectional(ch), "combining": unicodedata.combining(ch),
           "mirrored": unicodedata.mirrored(ch)}  # fmt: skip
    if decomposition := unicodedata.decomposition(ch):
        rec["decomposition"] = decomposition
    if (numeric := unicodedata.numeric(ch, None)) is not None:
        rec["numeric"] = numeric
    rec["east_asian_width"] = unicodedata.east_asian_width(ch)
    return rec


def _records() -> tuple[list[str], list[int]]:
    lines = [json.dumps(r) for r in map(_record, range(0x110000)) if r is not None]
    return lines, list(range(len(lines)))


_BUILDERS: dict[str, Callable[[], tuple[list[str], list[int]]]] = {
    "code": _code, "prose": _prose, "records": _records,
}  # fmt: skip


@cache
def identity(kind: str) -> dict:
    """Where the ``kind`` haystack comes from, with the sha256 of the files it reads (the
    Unicode version for ``records``: the database is compiled into ``unicodedata``)."""
    check_source(kind)
    python = f"CPython {platform.python_version()}"
    if kind == "records":
        return {"kind": kind, "source": f"unicodedata {unicodedata.unidata_version}, {python}"}
    files = _stdlib_files()
    source = f"{python} standard library, {len(files)} top-level .py files"
    if kind == "prose":
        import pydoc_data.topics

        files = [Path(pydoc_data.topics.__file__), *files]
        source = f"{python} pydoc_data.topics and the docstrings of its {len(files) - 1} files"
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return {"kind": kind, "source": source, "sha256": digest.hexdigest()[:16]}


@cache
def load(kind: str) -> Haystack:
    """The ``kind`` haystack of this Python (built once per process: the prose one parses every
    standard-library file, a few seconds)."""
    check_source(kind)
    lines, starts = _BUILDERS[kind]()
    return Haystack(kind, tuple(lines), tuple(starts), "\n".join(lines).lower())
