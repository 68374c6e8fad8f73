"""RULER's needle-in-a-haystack family (8 tasks): noise, essay or needle haystacks; word, number or
UUID keys and values; one or several needles, values and queries (NVIDIA/RULER
``scripts/data/synthetic/niah.py``).

Randomness, as RULER: keys, values, distractor needles, depths or line positions and the asked
keys are drawn from the sample's stream (RULER's module-level ``random``, seeded once, continuing
from sample to sample); the needles are shuffled with a fresh ``random.Random(seed)``
(:func:`~.common.fixed_shuffle`), the same permutation for every sample (it matters for the
multi-key, multi-value and multi-query tasks: which key's or value's needle comes first).
"""

from __future__ import annotations

import random
import uuid

from .common import (
    PromptFormat,
    essay_words,
    fit_size,
    fitted_draws,
    fixed_shuffle,
    sample_dict,
    sorted_words,
    split_sentences,
)
from .templates import DEPTHS, FAMILIES, NEEDLE, NOISE

# haystack unit per fitting step: essay words, or lines (noise sentences, distractor needles)
_STEP = {"essay": 500, "noise": 25, "needle": 25}


class _Draw:
    """Random keys and values of one kind (RULER's ``generate_random``)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.adjs = sorted_words("adjective")
        self.nouns = sorted_words("noun")

    def __call__(self, kind: str) -> str:
        if kind == "numbers":
            return str(self.rng.randint(10**6, 10**7 - 1))
        if kind == "words":  # uniform over adjective-noun pairs, as RULER's list of all pairs
            return f"{self.rng.choice(self.adjs)}-{self.rng.choice(self.nouns)}"
        if kind == "uuids":
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        raise ValueError(f"unknown needle type {kind!r}")


def _singular(text: str) -> str:
    # RULER rewrites the whole template when one value is asked for
    for a, b in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(a, b)
    return text


def make_task_text(
    args: dict, size: int, rng: random.Random, seed: int, essays_dir: str | None
) -> tuple:
    """One sample's task text (template filled, no answer prefix), answer prefix, answers, the
    needles' depths in percent (essay haystack) or line indices (noise/needle haystack), and
    ``{"evidence": the asked needles' texts, "question": the text after the haystack}``.
    ``args`` may hold a recipe variant's ``depth``, ``answer_prefix`` and ``line_break``
    (``recipe.niah_args``); without them, RULER's construction."""
    draw = _Draw(rng)
    nk = max(args["num_needle_k"], args["num_needle_q"])
    tk, tv = args["type_needle_k"], args["type_needle_v"]
    keys, values, needles = [], [], []
    for _ in range(nk):
        keys.append(draw(tk))
        values.append([draw(tv) for _ in range(args["num_needle_v"])])
        needles += [NEEDLE.format(type_needle_v=tv, key=keys[-1], value=v) for v in values[-1]]
    fixed_shuffle(needles, seed)

    haystack = args["type_haystack"]
    if haystack == "essay":
        words = essay_words(essays_dir)
        text = " ".join((words * (size // len(words) + 1))[:size])
        sents = split_sentences(text)
        depths = sorted(rng.sample(DEPTHS, len(needles)))
        if args.get("depth") is not None:  # a recipe variant: drawn as RULER, then overridden
            depths = [args["depth"]] * len(needles)
        cuts = [0] + [int(len(sents) * d / 100) for d in depths] + [len(sents)]
        parts = []
        for i in range(1, len(cuts)):
            parts.append(" ".join(sents[cuts[i - 1] : cuts[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(parts)
        where = depths
    else:
        if haystack == "noise":
            lines = [NOISE] * size
        elif haystack == "needle":
            lines = [
                NEEDLE.format(type_needle_v=tv, key=draw(tk), value=draw(tv)) for _ in range(size)
            ]
        else:
            raise ValueError(f"unknown haystack {haystack!r}")
        where = sorted(rng.sample(range(size), len(needles)), reverse=True)
        if args.get("depth") is not None:  # a recipe variant: drawn as RULER, then overridden
            where = [round(size * args["depth"] / 100)] * len(needles)
        for index, needle in zip(where, needles):
            lines.insert(index, needle)
        context = ("\n" if args.get("line_break", True) else " ").join(lines)
        where = sorted(where)

    asked = rng.sample(range(nk), args["num_needle_q"])
    queries = [keys[i] for i in asked]
    answers = [v for i in asked for v in values[i]]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]

    fam = FAMILIES["niah"]
    template, prefix, type_v = fam.template, fam.answer_prefix, tv
    if args["num_needle_q"] * args["num_needle_v"] == 1:
        template, prefix, type_v = _singular(template), _singular(prefix), tv[:-1]
    task_text = template.format(type_needle_v=type_v, context=context, query=query)
    # what evidence recall needs (eval/evidence.py): the asked needles, and the question (the
    # template's text after the haystack)
    needles_asked = [NEEDLE.format(type_needle_v=tv, key=keys[i], value=v)
                     for i in asked for v in values[i]]  # fmt: skip
    question = template.split("{context}", 1)[1].format(type_needle_v=type_v, query=query)
    evidence = {"evidence": needles_asked, "question": question}
    prefix = prefix.format(type_needle_v=type_v, query=query)
    if not args.get("answer_prefix", True):  # a recipe variant: the prompt ends at the question
        prefix = ""
    return task_text, prefix, answers, where, evidence


def where_needed(args: dict) -> range:
    """One haystack line per needle at least (noise/needle haystacks place needles among lines)."""
    return range(max(args["num_needle_k"], args["num_needle_q"]) * args["num_needle_v"])


def generate(
    args: dict, length: int, fmt: PromptFormat, n: int, seed: int, essays_dir: str | None = None
) -> list[dict]:
    budget = length - FAMILIES["niah"].tokens_to_generate
    step = _STEP[args["type_haystack"]]
    if args["type_haystack"] != "essay" and length < 4096:
        step = 5

    def tokens_at(size: int, rng: random.Random) -> tuple[int, tuple]:
        out = make_task_text(args, size, rng, seed, essays_dir)
        return fmt.n_tokens(fmt.render(out[0]) + out[1]), out

    probe_tokens = tokens_at(step, random.Random(f"{seed}-fit"))[0]
    guess = int(budget / max(probe_tokens / step, 1e-9))
    size = fit_size(lambda s: tokens_at(s, random.Random(f"{seed}-fit"))[0], budget, step, guess)

    def build(s: int, rng: random.Random):
        out = make_task_text(args, s, rng, seed, essays_dir)
        return fmt.render(out[0]) + out[1], out

    essay = args["type_haystack"] == "essay"
    draws = fitted_draws(n, seed, build, fmt.n_tokens, size, budget, step, "niah",
                         min_size=len(where_needed(args)))  # fmt: skip
    return [
        sample_dict(
            index,
            fmt.render(task_text),
            prefix,
            answers,
            tok,
            used,
            needle_depths=where if essay else None,
            needle_lines=None if essay else where,
            **evidence,
        )  # fmt: skip
        for index, (task_text, prefix, answers, where, evidence), tok, used in draws
    ]
