"""RULER's frequent words extraction (``fwe``): random 6-letter "coded words" with counts following
a zeta law (alpha 2); the most frequent is replaced by ``...`` (noise) and the answer is ranks 2-4
(NVIDIA/RULER ``scripts/data/synthetic/freq_words_extraction.py``).

Randomness, as RULER: each sample draws its coded words from its stream (RULER's module-level
``random``); the sorted vocabulary (which fixes the ranks) and the text's word list are each
shuffled with a fresh ``random.Random(seed)`` (:func:`~.common.fixed_shuffle`), the same
permutations for every sample: at one size, the positions of each rank's occurrences are the same
in every sample; only the coded words differ.
"""

from __future__ import annotations

import math
import random
import string

from .common import PromptFormat, fit_size, fitted_draws, fixed_shuffle, sample_dict
from .templates import FAMILIES


def zeta(alpha: float) -> float:
    """Riemann zeta(alpha), alpha > 1: a partial sum plus the Euler-Maclaurin tail (error < 1e-12
    for alpha >= 1.5), so the generator needs no scipy."""
    if alpha <= 1:
        raise ValueError(f"zeta needs alpha > 1, got {alpha}")
    n = 1000
    head = math.fsum(k**-alpha for k in range(1, n))
    tail = n ** (1 - alpha) / (alpha - 1) + 0.5 * n**-alpha + alpha * n ** (-alpha - 1) / 12
    return head + tail


def _vocab(rng: random.Random, size: int, wordlen: int, seed: int) -> list[str]:
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=wordlen)))
    out = sorted(vocab)
    fixed_shuffle(out, seed)
    out[0] = "..."  # the top-ranked word is noise
    return out


def make_task_text(args: dict, num_words: int, vocab: list[str], seed: int) -> tuple:
    alpha = args["alpha"]
    z = zeta(alpha)
    words = []
    for k, w in enumerate(vocab, start=1):
        words += [w] * int(num_words * k**-alpha / z)
    fixed_shuffle(words, seed)
    return FAMILIES["fwe"].template.format(context=" ".join(words)), vocab[1:4]


def generate(args: dict, length: int, fmt: PromptFormat, n: int, seed: int) -> list[dict]:
    fam = FAMILIES["fwe"]
    budget = length - fam.tokens_to_generate
    vocab_size = budget // 50

    def full(size: int, rng: random.Random) -> tuple[str, tuple]:
        vocab = _vocab(rng, vocab_size, args["coded_wordlen"], seed)
        task, answer = make_task_text(args, size, vocab, seed)
        return fmt.render(task) + fam.answer_prefix, (task, answer)

    step = max(budget // 32, 1)
    size = fit_size(
        lambda s: fmt.n_tokens(full(s, random.Random(f"{seed}-fit"))[0]),
        budget,
        step,
        budget // args["coded_wordlen"],
    )
    draws = fitted_draws(n, seed, full, fmt.n_tokens, size, budget, step, "fwe")
    return [
        sample_dict(index, fmt.render(task), fam.answer_prefix, answer, tok, used)
        for index, (task, answer), tok, used in draws
    ]
