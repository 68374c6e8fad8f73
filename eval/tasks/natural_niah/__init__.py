"""Needles in natural haystacks: multi-key, multi-value and multi-query retrieval in real source
code, prose and structured records (``benchmark=natural_niah``).

RULER's haystacks are a repeated sentence, essays, or needles alone; a method can keep every
needle there and lose most of them in a long, natural, non-repetitive text (issue 52). Here the
haystacks are text that ships with this Python (:mod:`.haystacks`: the standard library's source,
its Language Reference topics and docstrings, the Unicode Character Database), the needles are
RULER's sentence in the haystack's own form (a comment line, a paragraph, a JSON record), and the
question, answer prefix and metric are RULER's niah ones (:mod:`.build`).

Tasks are ``<haystack>_<form>``: haystack ``code``, ``prose`` or ``records``; form ``multikey``
(one key asked, one value), ``multivalue`` (one key, four values) or ``multiquery`` (four keys,
one value each). ``benchmark.data`` holds the knobs:

- ``distractors``: other keys in needles of the same form (as many values each as an asked key);
- ``depth``: every asked needle at this depth (percent of the haystack's lines), null: random.

A sample made with knobs other than the defaults names them in its task
(``code_multikey[depth=50]``), as RULER's recipe variants do; its line records its asked needles'
depths, its number of distractors and where its haystack came from (:func:`.haystacks.identity`,
also in the cache key). Length = the prompt's tokens (chat template and answer prefix included)
plus the 128 tokens to generate, within 2% under the target; 16K to 128K is the suite's range.
Sample ``i`` depends only on (task, length, tokenizer and template, seed, knobs, haystack source):
its own random stream, seeded with all of them but the knobs, so a depth variant keeps the keys.

Validation (dense Qwen answers most samples at 16K and 32K, or the suite measures the model) is a
GPU run still to make; see docs/accuracy.md.
"""

from __future__ import annotations

import importlib.metadata
import random
from pathlib import Path

from ... import metrics
from ..base import Task, TaskConfigError, make_sample, register
from ..cache import cached_samples
from ..ruler.common import PromptFormat
from . import build, haystacks
from .haystacks import HaystackSourceMissing

# bump when a generated sample changes: cached samples are then rebuilt
GENERATOR_VERSION = 1
TASKS = {f"{kind}_{form}": (kind, form) for kind in haystacks.KINDS for form in build.FORMS}
DEFAULTS = {"distractors": 16, "depth": None}


def knobs(data: dict | None) -> dict:
    """``benchmark.data``'s knobs with defaults filled in, validated."""
    data = dict(data or {})
    unknown = sorted(set(data) - set(DEFAULTS))
    if unknown:
        raise TaskConfigError(f"benchmark.data: unknown key(s) {unknown}; known: {list(DEFAULTS)}")
    out = {**DEFAULTS, **{k: v for k, v in data.items() if v is not None or k == "depth"}}
    d, depth = out["distractors"], out["depth"]
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise TaskConfigError(f"benchmark.data.distractors={d!r}: an int >= 0")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or not 0 <= depth <= 100):  # fmt: skip
        raise TaskConfigError(f"benchmark.data.depth={depth!r}: an int percent in 0..100 or null")
    return out


def label(task: str, data: dict | None) -> str:
    """``task`` at the default knobs, else ``task[depth=50,distractors=4]``."""
    diff = {k: v for k, v in knobs(data).items() if v != DEFAULTS[k]}
    return f"{task}[{','.join(f'{k}={v}' for k, v in sorted(diff.items()))}]" if diff else task


def generate(task: str, length: int, fmt: PromptFormat, n: int, seed: int = 42,
             data: dict | None = None) -> list[dict]:  # fmt: skip
    """``n`` samples of ``task`` at ``length`` tokens (module docstring)."""
    kind, form = TASKS[task]
    k, name = knobs(data), label(task, data)
    hay, source = haystacks.load(kind), haystacks.identity(kind)
    out = []
    for index in range(n):
        rng = random.Random(f"natural_niah/{task}/{length}/{seed}/{index}")
        d = build.draw(hay, form, k["distractors"], k["depth"], rng)
        s = _fitted(hay, d, form, int(length), fmt, f"natural_niah {name} at {length}, #{index}")
        out.append(dict(
            id=f"natural_niah/{name}/{length}/{seed}/{index}", task=name, length=int(length), **s,
            total_tokens=s["prompt_tokens"] + build.TOKENS_TO_GENERATE,
            tokens_to_generate=build.TOKENS_TO_GENERATE, metric=build.METRIC,
            distractors=k["distractors"], needles=len(d.needles), haystack_start=d.start,
            haystack=source,
        ))  # fmt: skip
    return out


def _fitted(hay, d: build.Draw, form: str, length: int, fmt: PromptFormat, what: str) -> dict:
    """The sample of draw ``d`` with the most haystack lines that fit ``length``."""
    template, prefix, question = build.question(form, d.asked)

    def prompt(lines: int) -> tuple[str, list[float]]:
        context, depths = build.render(hay, d, lines)
        return fmt.render(template.replace("{context}", context)), depths

    budget = length - build.TOKENS_TO_GENERATE
    count = lambda m: fmt.n_tokens(prompt(m)[0] + prefix)  # noqa: E731
    lines, tokens = build.fit_lines(count, budget, len(hay.lines), what)
    text, depths = prompt(lines)
    return dict(input=text, answer_prefix=prefix, outputs=list(d.answers), prompt_tokens=tokens,
                evidence=[x.sentence for x in d.needles if x.asked], question=question,
                depth=depths, haystack_lines=lines)  # fmt: skip


def load_samples(
    task: str,
    length: int,
    fmt: PromptFormat,
    n: int,
    seed: int = 42,
    data: dict | None = None,
    cache_dir: str | Path | None = None,
) -> list[dict]:
    """:func:`generate` through the sample cache (``cache_dir=None``: no cache), keyed by what
    the samples depend on, the haystack's source and the key words' package version included."""
    if task not in TASKS:
        raise KeyError(f"unknown natural_niah task {task!r}; known: {sorted(TASKS)}")
    key = dict(
        benchmark="natural_niah", task=label(task, data), length=int(length),
        tokenizer=fmt.identity(), seed=int(seed), n=int(n), version=GENERATOR_VERSION,
        knobs=knobs(data), haystack=haystacks.identity(TASKS[task][0]),
        words=f"wonderwords {importlib.metadata.version('wonderwords')}",
    )  # fmt: skip
    return cached_samples(key, lambda: generate(task, length, fmt, n, seed, data), cache_dir)


@register
class NaturalNiah(Task):
    """Samples from :func:`load_samples` (cached), scored by RULER's ``string_match_all``."""

    name = "natural_niah"

    def check(self, bench: dict) -> None:
        tasks = list(bench.get("tasks") or [])
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise TaskConfigError(f"benchmark.tasks: unknown natural_niah task(s) {unknown}; "
                                  f"known: {sorted(TASKS)}")  # fmt: skip
        if bench.get("n") is None:
            raise TaskConfigError("benchmark=natural_niah generates its samples: give "
                                  "benchmark.n=<int>")  # fmt: skip
        knobs(bench.get("data"))
        try:
            importlib.metadata.version("wonderwords")
        except importlib.metadata.PackageNotFoundError:
            raise TaskConfigError(
                "benchmark=natural_niah draws its keys from PyPI `wonderwords`, which is not "
                "installed: pip install -e '.[bench]'"
            ) from None
        for kind in sorted({TASKS[t][0] for t in tasks}):
            try:
                haystacks.check_source(kind)
            except HaystackSourceMissing as e:
                raise TaskConfigError(f"benchmark.tasks: the {kind} haystack: {e}") from None

    def lengths(self, bench: dict) -> list:
        return list(bench["lengths"])

    def samples(self, bench: dict, fmt: PromptFormat) -> list[dict]:
        self.check(bench)
        keep = ("metric", "evidence", "question", "depth", "distractors", "haystack")
        return [
            make_sample(s, s["input"] + s["answer_prefix"], s["tokens_to_generate"], keep)
            for task in bench["tasks"]
            for length in bench["lengths"]
            for s in load_samples(
                task, length, fmt, bench["n"], bench["seed"], bench.get("data"), bench["cache_dir"]
            )  # fmt: skip
        ]

    def score(self, sample: dict, prediction: str) -> tuple[float, dict]:
        extra = {k: sample[k] for k in ("depth", "distractors", "haystack") if k in sample}
        return metrics.ruler_score(sample["metric"], prediction, sample["gold"]), extra
