"""RULER's common words extraction (``cwe``): a numbered word list where 10 words appear often
(30x, or 6x under 4K tokens) and the rest rarely (3x, or 1x); one solved example first (NVIDIA/RULER
``scripts/data/synthetic/common_words_extraction.py``).

Prompt, as RULER: RULER fills its whole prompt template (model template + task template + answer
prefix) once for the solved example, appends the example's answer, then a newline and the same
template filled with the question. With a chat template the example is therefore a conversation of
its own: a user turn holding the example's list and an assistant turn holding the answer prefix and
the answer (left unclosed, as RULER's string template leaves it), then the question's user turn
and the generation prompt (for a template with a system prompt or a BOS token, those appear twice,
as in RULER). With the ``base`` template (render = identity) this is plain concatenation.

Randomness, as RULER: the vocabulary is shuffled once with ``random.Random(seed)``; each list's
words are drawn from the sample's stream (RULER's module-level ``random``), but the list is
shuffled with a fresh ``random.Random(seed)`` (:func:`~.common.fixed_shuffle`): the same permutation
of positions for every sample (one for the example's list, one for the question's), so lists of
one size put the common words at the same positions in every sample; only the words differ.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .common import (
    PromptFormat,
    fit_size,
    fitted_draws,
    fixed_shuffle,
    identity,
    sample_dict,
    sorted_words,
)
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
    vocab: list[str],
    num_words: int,
    common: int,
    uncommon: int,
    num_cw: int,
    rng: random.Random,
    seed: int,
) -> tuple[str, list[str]]:
    if num_words > len(vocab):
        raise ValueError(
            f"cwe needs {num_words} distinct words, the vocabulary has {len(vocab)}: set "
            "benchmark.data.cwe_words to RULER's english_words.json (scripts/data/synthetic/json/ "
            "in NVIDIA/RULER, a Git LFS file) for this length"
        )
    chosen = rng.sample(vocab, num_words)
    listing = chosen[:num_cw] * common + chosen[num_cw:] * uncommon
    fixed_shuffle(listing, seed)
    return _numbered(listing), chosen[:num_cw]


def make_input(
    args: dict,
    length: int,
    num_words: int,
    vocab: list[str],
    rng: random.Random,
    seed: int,
    render=identity,
) -> tuple[str, list[str]]:
    """The model's input up to the question's answer prefix, and the answer: each solved example
    rendered as a prompt of its own and answered, then the question rendered (module docstring)."""
    fam = FAMILIES["cwe"]
    if length < 4096:
        shot, main = (20, 3, 1), (num_words, 6, 1)
    else:
        shot, main = (40, 10, 3), (num_words, args["freq_cw"], args["freq_ucw"])
    shots = []
    for _ in range(args["num_fewshot"]):
        ctx, ans = _example(vocab, *shot, args["num_cw"], rng, seed)
        shot_prompt = render(fam.template.format(context=ctx)) + fam.answer_prefix
        shots.append(shot_prompt + " " + _numbered(ans))
    ctx, answer = _example(vocab, *main, args["num_cw"], rng, seed)
    return "\n".join(shots) + "\n" + render(fam.template.format(context=ctx)), answer


def generate(
    args: dict, length: int, fmt: PromptFormat, n: int, seed: int, words_file: str | None = None
) -> list[dict]:
    fam = FAMILIES["cwe"]
    budget = length - fam.tokens_to_generate
    vocab = vocabulary(words_file)
    random.Random(seed).shuffle(vocab)

    def full(size: int, rng: random.Random) -> tuple[str, tuple]:
        text, answer = make_input(args, length, size, vocab, rng, seed, fmt.render)
        return text + fam.answer_prefix, (text, answer)

    probe = fmt.n_tokens(full(100, random.Random(f"{seed}-fit"))[0])
    guess = int(budget * 100 / max(probe, 1))

    def n_tok(size: int) -> int:
        if size > len(vocab):
            return budget + 1
        return fmt.n_tokens(full(size, random.Random(f"{seed}-fit"))[0])

    size = fit_size(n_tok, budget, args["num_cw"] + 1, min(guess, len(vocab)))
    if size == len(vocab):  # RULER switches to its larger word list here
        _example(vocab, len(vocab) + 1, 1, 1, 1, random.Random(0), seed)  # raises with the hint
    draws = fitted_draws(n, seed, full, fmt.n_tokens, size, budget, 10, "cwe",
                         min_size=args["num_cw"] + 1)  # fmt: skip
    return [
        sample_dict(index, text, fam.answer_prefix, answer, tok, used)
        for index, (text, answer), tok, used in draws
    ]
