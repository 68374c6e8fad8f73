"""RULER (Hsieh et al. 2024): its 13 synthetic tasks generated offline with the official templates,
answer prefixes, needle formats, depths, tokens to generate and metrics.

>>> fmt = PromptFormat(tokenizer, render=chat_template_of(tokenizer), add_special_tokens=False)
>>> samples = load_samples("niah_single_1", 4096, fmt, n=50, seed=42, cache_dir="cache/benchmarks")
>>> prompt = samples[0]["input"] + samples[0]["answer_prefix"]   # what the model continues
>>> score = eval.metrics.ruler_score(samples[0]["metric"], prediction, samples[0]["outputs"])

Length = tokens of ``input + answer_prefix`` (``input`` already has the model's template) plus the
task's tokens to generate, at most the target, as in RULER. One sample per index; sample ``i``
depends only on (task, length, tokenizer and template, seed), so every method sees the same ones.

Randomness follows RULER's two sources. What RULER draws from its module-level ``random`` (seeded
once with ``--random_seed``, continuing from sample to sample) each generator draws from one stream
seeded with ``seed``, sample after sample. What RULER shuffles with a fresh
``random.Random(random_seed)`` (niah's needles, cwe's word lists, fwe's vocabulary and word list,
qa's documents) is shuffled by ``common.fixed_shuffle``: the same permutation for every sample.
vt has no such shuffle. Each task module's docstring says which of its draws is which.
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import metrics
from ..base import Task, TaskConfigError, make_sample, register
from ..cache import cached_samples, file_identity
from . import cwe, fwe, niah, qa, recipe, vt
from .common import PromptFormat, default_essays_dir, identity
from .templates import FAMILIES, TASKS, family_of

__all__ = [
    "GENERATOR_VERSION",
    "PromptFormat",
    "Ruler",
    "TASKS",
    "check_recipe",
    "generate",
    "identity",
    "load_samples",
]

# bump when a generator's output changes: cached samples are then rebuilt. 2: RULER's fixed-seed
# shuffles; cwe's solved example rendered as a prompt of its own (its own chat turns). 3: niah
# samples name their evidence (the asked needles) and question (same prompts as 2)
GENERATOR_VERSION = 3


def generate(
    task: str, length: int, fmt: PromptFormat, n: int, seed: int = 42, data: dict | None = None
) -> list[dict]:
    """``n`` samples of ``task`` at ``length`` tokens. ``data`` may hold ``essays_dir``,
    ``squad``, ``hotpotqa`` and ``cwe_words`` paths (None: package data or the hub) and a niah
    task's ``recipe`` variant (:mod:`.recipe`; its samples' task and id name it)."""
    data = dict(data or {})
    spec = TASKS[task] if task in TASKS else family_of(task)
    fam = FAMILIES[spec.family]
    name = recipe.label(task, data.get("recipe"))
    if name != task and spec.family != "niah":
        raise ValueError(f"benchmark.data.recipe varies niah tasks only, not {task!r}")
    if spec.family == "niah":
        args = recipe.niah_args(spec.args, data.get("recipe"))
        raw = niah.generate(args, length, fmt, n, seed, data.get("essays_dir"))
    elif spec.family == "vt":
        raw = vt.generate(spec.args, length, fmt, n, seed)
    elif spec.family == "cwe":
        raw = cwe.generate(spec.args, length, fmt, n, seed, data.get("cwe_words"))
    elif spec.family == "fwe":
        raw = fwe.generate(spec.args, length, fmt, n, seed)
    else:
        raw = qa.generate(spec.args, length, fmt, n, seed, data.get(spec.args["dataset"]))
    out = []
    for s in raw:
        s = {k: v for k, v in s.items() if v is not None}
        out.append(
            dict(
                id=f"ruler/{name}/{length}/{seed}/{s['index']}",
                task=name,
                length=length,
                **s,
                tokens_to_generate=fam.tokens_to_generate,
                metric=fam.metric,
                total_tokens=s["prompt_tokens"] + fam.tokens_to_generate,
            )
        )
    return out


def missing_packages(tasks: list[str], data: dict | None = None) -> dict[str, list[str]]:
    """The PyPI packages the generators of ``tasks`` import and this Python lacks, each with the
    tasks that need it (niah's keys and cwe's default word lists come from ``wonderwords``), so
    that a job is refused before a model loads rather than after."""
    import importlib.util

    data = dict(data or {})
    need: dict[str, list[str]] = {}
    for task in tasks:
        family = TASKS[task].family
        if family == "niah" or (family == "cwe" and not data.get("cwe_words")):
            need.setdefault("wonderwords", []).append(task)
    return {pkg: ts for pkg, ts in need.items() if importlib.util.find_spec(pkg) is None}


def check_recipe(tasks: list[str], variant: dict | None) -> None:
    """Refuse a recipe variant (:mod:`.recipe`) that is invalid or names a non-niah task."""
    if recipe.changes(variant):
        other = [t for t in tasks if TASKS[t].family != "niah"]
        if other:
            raise ValueError(f"benchmark.data.recipe varies niah tasks only, not {other}")
        for t in tasks:
            recipe.niah_args(TASKS[t].args, variant)


def _data_identity(task: str, data: dict) -> dict:
    spec = TASKS[task]
    if spec.family == "niah":
        out = {"recipe": diff} if (diff := recipe.changes(data.get("recipe"))) else {}
        if recipe.niah_args(spec.args, data.get("recipe"))["type_haystack"] == "essay":
            out["essays"] = file_identity(data.get("essays_dir") or default_essays_dir())
        return out
    if spec.family == "qa":
        name = spec.args["dataset"]
        return {name: file_identity(data.get(name)) or "hub"}
    if spec.family == "cwe":
        return {"cwe_words": file_identity(data.get("cwe_words"))}
    return {}


def load_samples(
    task: str,
    length: int,
    fmt: PromptFormat,
    n: int,
    seed: int = 42,
    data: dict | None = None,
    cache_dir: str | Path | None = None,
) -> list[dict]:
    """``generate`` through the sample cache (``cache_dir=None``: no cache)."""
    if task not in TASKS:
        raise KeyError(f"unknown RULER task {task!r}; known: {sorted(TASKS)}")
    data = dict(data or {})
    check_recipe([task], data.get("recipe"))
    key = dict(
        benchmark="ruler",
        task=task,
        length=int(length),
        tokenizer=fmt.identity(),
        seed=int(seed),
        n=int(n),
        version=GENERATOR_VERSION,
        data=_data_identity(task, data),
    )
    return cached_samples(key, lambda: generate(task, length, fmt, n, seed, data), cache_dir)


def _cached_from_hub(task: str, dataset: str, bench: dict) -> bool:
    """Whether :func:`load_samples` cached samples of ``task`` made from the hub's ``dataset`` at
    every length of ``bench`` with its seed and n (any tokenizer)."""
    if not bench.get("cache_dir"):
        return False
    want = dict(benchmark="ruler", task=task, seed=bench.get("seed"), n=bench.get("n"),
                version=GENERATOR_VERSION, data={dataset: "hub"})  # fmt: skip
    got = set()
    for path in (Path(bench["cache_dir"]) / "ruler" / task).glob("*.key.json"):
        key = json.loads(path.read_text())
        if all(key.get(k) == v for k, v in want.items()):
            got.add(key.get("length"))
    return set(bench.get("lengths") or []) <= got


@register
class Ruler(Task):
    """RULER as a benchmark task: samples from :func:`load_samples` (cached), each task's own
    metric (:func:`eval.metrics.ruler_score`)."""

    name = "ruler"

    def check(self, bench: dict) -> None:
        tasks = list(bench.get("tasks") or [])
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise TaskConfigError(
                f"benchmark.tasks: unknown RULER task(s) {unknown}; known: {sorted(TASKS)}"
            )
        if bench.get("n") is None:
            raise TaskConfigError("benchmark=ruler generates its samples: give benchmark.n=<int>")
        for pkg, need in missing_packages(tasks, bench.get("data")).items():
            raise TaskConfigError(
                f"benchmark.tasks {need} need PyPI `{pkg}`, which is not installed: "
                "pip install -e '.[bench]' (or carry its wheel to a machine without network)"
            )

    def hub_data(self, bench: dict) -> list[tuple[str, str, str]]:
        """qa_1's SQuAD and qa_2's HotpotQA when no file is given for them, unless samples made
        from the hub are cached for the task at the job's lengths, seed and n (by some tokenizer:
        the model's is not known before it loads, so such a job is let through)."""
        data, out = dict(bench.get("data") or {}), []
        for task in bench.get("tasks") or []:
            name = TASKS[task].args.get("dataset") if TASKS[task].family == "qa" else None
            if name and not data.get(name) and not _cached_from_hub(task, name, bench):
                out.append((name, qa.HUB_IDS[name], qa.HOW_TO_GET[name]))
        return out

    def lengths(self, bench: dict) -> list:
        return list(bench["lengths"])

    def samples(self, bench: dict, fmt: PromptFormat) -> list[dict]:
        n, seed, data = bench["n"], bench["seed"], dict(bench.get("data") or {})
        if n is None:
            raise TaskConfigError("benchmark=ruler generates its samples: give benchmark.n=<int>")
        keep = ("metric", "evidence", "question")
        return [
            make_sample(s, s["input"] + s["answer_prefix"], s["tokens_to_generate"], keep)
            for task in bench["tasks"]
            for length in bench["lengths"]
            for s in load_samples(task, length, fmt, n, seed, data, bench["cache_dir"])
        ]

    def score(self, sample: dict, prediction: str) -> tuple[float, dict]:
        return metrics.ruler_score(sample["metric"], prediction, sample["gold"]), {}
