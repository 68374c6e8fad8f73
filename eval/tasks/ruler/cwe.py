"""RULER's common words extraction (``cwe``): a numbered word list where 10 words appear often
(30x, or 6x under 4K tokens) and the rest rarely (3x, or 1x); one solved example first (NVIDIA/RULER
``scripts/data/synthetic/common_words_extraction.py``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from .common import PromptFormat, fit_size, fitted_draws, sample_dict, sorted_words
from .templates import FAMILIES


def vocabulary(words_file: str | None = None) -> list[str]:
    """wonderwords' nouns, adjectives and verbs; with ``words_file`` (RULER's
    ``english_words.json``, a JSON object whose values are words) that list instead, which long
    contexts need once the wonderwords vocabulary is exhausted."""
    if words_file:
        path = Path(words_file)
        if not path.is_file():
            raise FileNotFoundError(f"benchmark.data.cwe_words: {path} does not exist")
        return sorted(set(json.loads(path.read_text()).values()))
    return sorted(set(sorted_words("noun") + sorted_words("adjective") + sorted_words("verb")))


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _example(
    vocab: list[str], num_words: int, common: int, uncommon: int, num_cw: int, rng: random.Random
) -> tuple[str, list[str]]:
    if num_words > len(vocab):
        raise ValueError(
            f"cwe needs {num_words} distinct words, the vocabulary has {len(vocab)}: set "
            "benchmark.data.cwe_words to RULER's english_words.json (scripts/data/synthetic/json/ "
            "in NVIDIA/RULER, a Git LFS file) for this length"
        )
    chosen = rng.sample(vocab, num_words)
    listing = chosen[:num_cw] * common + chosen[num_cw:] * uncommon
    rng.shuffle(listing)
    return _numbered(listing), chosen[:num_cw]


def make_task_text(
    args: dict, length: int, num_words: int, vocab: list[str], rng: random.Random
) -> tuple[str, list[str]]:
    fam = FAMILIES["cwe"]
    if length < 4096:
        shot, main = (20, 3, 1), (num_words, 6, 1)
    else:
        shot, main = (40, 10, 3), (num_words, args["freq_cw"], args["freq_ucw"])
    shots = []
    for _ in range(args["num_fewshot"]):
        ctx, ans = _example(vocab, *shot, args["num_cw"], rng)
        shots.append(fam.template.format(context=ctx) + fam.answer_prefix + " " + _numbered(ans))
    ctx, answer = _example(vocab, *main, args["num_cw"], rng)
    return "\n".join(shots) + "\n" + fam.template.format(context=ctx), answer


def generate(
    args: dict, length: int, fmt: PromptFormat, n: int, seed: int, words_file: str | None = None
) -> list[dict]:
    fam = FAMILIES["cwe"]
    budget = length - fam.tokens_to_generate
    vocab = vocabulary(words_file)
    random.Random(seed).shuffle(vocab)

    def full(size: int, rng: random.Random) -> tuple[str, tuple]:
        task, answer = make_task_text(args, length, size, vocab, rng)
        return fmt.render(task) + fam.answer_prefix, (task, answer)

    probe = fmt.n_tokens(full(100, random.Random(f"{seed}-fit"))[0])
    guess = int(budget * 100 / max(probe, 1))

    def n_tok(size: int) -> int:
        if size > len(vocab):
            return budget + 1
        return fmt.n_tokens(full(size, random.Random(f"{seed}-fit"))[0])

    size = fit_size(n_tok, budget, args["num_cw"] + 1, min(guess, len(vocab)))
    if size == len(vocab):  # RULER switches to its larger word list here
        _example(vocab, len(vocab) + 1, 1, 1, 1, random.Random(0))  # raises with the hint
    draws = fitted_draws(n, seed, full, fmt.n_tokens, size, budget, 10, "cwe",
                         min_size=args["num_cw"] + 1)  # fmt: skip
    return [
        sample_dict(index, fmt.render(task), fam.answer_prefix, answer, tok, used)
        for index, (task, answer), tok, used in draws
    ]
