"""One sample: keys and values, a window of the haystack, the needles' places, the fit to a length.

1. Draw everything random first (:func:`draw`), from the sample's own stream: where the window
   starts, the keys (RULER's adjective-noun words, each absent from the whole haystack and no
   key inside another), their values (7-digit numbers absent from the haystack, all distinct),
   and each needle's depth (a fraction of the window). The asked needles sit at ``depth`` percent
   when it is given (the draw still happens, so the keys stay those of the default sample), else
   at random depths; distractors (other keys, as many values each as an asked key, the same
   sentence) at random depths.
2. Render a window of ``n`` lines (:func:`render`): each needle goes to the place nearest its
   depth where the haystack allows one (:meth:`.haystacks.Haystack.slots`), in its form.
3. Fit ``n`` (:func:`fit_lines`): the largest number of lines whose prompt (chat template, answer
   prefix) plus the tokens to generate stays within the length, found to within ``SLACK`` of it
   by a safeguarded secant on the token count (a few tokenizations of the whole prompt, not a
   binary search's dozen: 128K-token prompts).

The question and the answer prefix are RULER's niah ones (``templates.FAMILIES["niah"]``, its
singular form when one value is asked), so the score is RULER's ``string_match_all``.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass

from ..ruler.common import sorted_words
from ..ruler.niah import _singular
from ..ruler.templates import FAMILIES, NEEDLE
from .haystacks import Haystack

# form: (asked keys, values per key)
FORMS = {"multikey": (1, 1), "multivalue": (1, 4), "multiquery": (4, 1)}
TOKENS_TO_GENERATE = FAMILIES["niah"].tokens_to_generate
METRIC = FAMILIES["niah"].metric
VALUE_TYPE = "numbers"
SLACK = 0.02  # a prompt is fitted to within this share of its length (tokens to generate included)
MAX_FIT_STEPS = 30


@dataclass(frozen=True)
class Needle:
    key: str
    value: str
    depth: float  # wanted place, a fraction of the window
    asked: bool

    @property
    def sentence(self) -> str:
        return NEEDLE.format(type_needle_v=VALUE_TYPE, key=self.key, value=self.value)


@dataclass(frozen=True)
class Draw:
    """What is random about a sample; fitting changes only the window's size."""

    start: int  # the window's first line in the haystack
    needles: tuple[Needle, ...]  # in the order they go in where two share a place
    asked: tuple[str, ...]  # the asked keys, in the question's order
    answers: tuple[str, ...]  # their values, key by key


def _keys(count: int, rng: random.Random, hay: Haystack) -> list[str]:
    adjs, nouns = sorted_words("adjective"), sorted_words("noun")
    keys: list[str] = []
    while len(keys) < count:
        key = f"{rng.choice(adjs)}-{rng.choice(nouns)}"
        if key.lower() in hay.lowered or any(key in k or k in key for k in keys):
            continue
        keys.append(key)
    return keys


def _values(count: int, rng: random.Random, hay: Haystack) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = str(rng.randint(10**6, 10**7 - 1))
        if value not in hay.lowered and value not in values:
            values.append(value)
    return values


def draw(hay: Haystack, form: str, distractors: int, depth: int | None,
         rng: random.Random) -> Draw:  # fmt: skip
    """Step 1 for one sample (module docstring)."""
    n_asked, per_key = FORMS[form]
    start = hay.starts[rng.randrange(len(hay.starts))]
    keys = _keys(n_asked + distractors, rng, hay)
    values = _values(len(keys) * per_key, rng, hay)
    needles = []
    for i, key in enumerate(keys):
        for value in values[i * per_key : (i + 1) * per_key]:
            where = rng.random()
            if i < n_asked and depth is not None:
                where = depth / 100
            needles.append(Needle(key, value, where, asked=i < n_asked))
    rng.shuffle(needles)
    asked = tuple(keys[:n_asked])
    answers = tuple(v for k in asked for v in values[keys.index(k) * per_key :][:per_key])
    return Draw(start, tuple(needles), asked, answers)


def render(hay: Haystack, d: Draw, n: int) -> tuple[str, list[float]]:
    """Step 2: the context of ``n`` haystack lines from ``d.start`` (wrapping at the end) with
    the needles in, and the asked needles' depths (percent of the window's lines before each)."""
    if n > len(hay.lines):
        raise ValueError(f"the {hay.kind} haystack has {len(hay.lines)} lines, {n} were asked")
    window = [hay.lines[(d.start + i) % len(hay.lines)] for i in range(n)]
    slots = hay.slots(window)
    at: dict[int, list[Needle]] = {}
    for needle in d.needles:
        at.setdefault(_nearest(slots, needle.depth * n), []).append(needle)
    out, depths = [], []
    for i in range(n + 1):
        below = window[i] if i < n else None
        for needle in at.get(i, []):
            out += hay.needle(needle.sentence, below)
            if needle.asked:
                depths.append(round(100 * i / max(n, 1), 1))
        if below is not None:
            out.append(below)
    return "\n".join(out), depths


def _nearest(slots: list[int], x: float) -> int:
    j = bisect.bisect_left(slots, x)
    near = slots[max(j - 1, 0) : j + 1]
    return min(near, key=lambda s: (abs(s - x), s))


def fit_lines(count: Callable[[int], int], budget: int, limit: int, what: str) -> tuple[int, int]:
    """Step 3: ``(n, count(n))`` for the largest ``n <= limit`` lines with ``count(n) <= budget``,
    or an ``n`` whose count is within ``SLACK`` of the budget. ``count`` grows with ``n``."""
    lo, t_lo = 0, None  # lo: fits; hi: too long
    hi = limit + 1
    n0, t0 = 0, count(0)
    if t0 > budget:
        raise ValueError(f"{what}: the prompt without haystack is {t0} tokens > {budget}")
    n = min(limit, 64)
    for _ in range(MAX_FIT_STEPS):
        t = count(n)
        if t <= budget:
            lo, t_lo = n, t
            if t >= budget - SLACK * (budget + TOKENS_TO_GENERATE) or n == limit:
                break
        else:
            hi = n
        if hi - lo <= 1:
            break
        target = budget - SLACK * (budget + TOKENS_TO_GENERATE) / 2
        guess = n + (target - t) * (n - n0) / max(t - t0, 1)  # secant through the last two
        n0, t0 = n, t
        n = round(guess) if lo < round(guess) < hi else (lo + hi) // 2  # else bisect
    if t_lo is None:
        raise ValueError(f"{what}: no haystack size fits {budget} tokens")
    if lo == limit and t_lo < budget - SLACK * (budget + TOKENS_TO_GENERATE):
        raise ValueError(f"{what}: the whole haystack ({limit} lines) is {t_lo} tokens, short of "
                         f"{budget}; ask for a shorter length")  # fmt: skip
    return lo, t_lo


def question(form: str, asked: tuple[str, ...]) -> tuple[str, str, str]:
    """RULER's niah template, answer prefix and the question (the template's text after the
    haystack), in the singular when one value is asked."""
    n_asked, per_key = FORMS[form]
    fam = FAMILIES["niah"]
    template, prefix, type_v = fam.template, fam.answer_prefix, VALUE_TYPE
    if n_asked * per_key == 1:
        template, prefix, type_v = _singular(template), _singular(prefix), VALUE_TYPE[:-1]
    query = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]
    template = template.replace("{type_needle_v}", type_v).replace("{query}", query)
    prefix = prefix.format(type_needle_v=type_v, query=query)
    return template, prefix, template.split("{context}", 1)[1]
