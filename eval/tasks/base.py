"""A benchmark task behind one interface, registered by name (lm-evaluation-harness's ``Task``: the
runner never names a benchmark).

A task owns its samples (with their prompts), its metric and its aggregation; the runner
(``experiments/accuracy.py``) only prefills, decodes and writes lines:

>>> task = get(bench["name"])        # bench: the job's ``benchmark`` block (conf/benchmark/*.yaml)
>>> task.check(bench)                # before the model loads; TaskConfigError names the key
>>> task.hub_data(bench)             # the hub sets the samples would load (checked before too)
>>> for s in task.samples(bench, fmt):
...     first = generate(s["prompt"], s["max_new_tokens"])
...     gen = task.second_turn(s, first, ask)      # LongBench v2's CoT answer turn, else ``first``
...     value, extra = task.score(s, gen["prediction"])
>>> task.aggregate(lines)            # a benchmark-level breakdown for the job's metrics, or None

A sample is a dict: ``id, task, length, prompt, gold, max_new_tokens`` plus the fields its task
keeps for scoring or for its line (:func:`make_sample`). A benchmark's module registers its task
(:func:`register`) under the name its ``conf/benchmark/<name>.yaml`` gives; :func:`get` imports
every module of this package once, so adding a benchmark touches only its own module and config.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a benchmark's module imports this one: no import back at run time
    from .ruler.common import PromptFormat

# ask(text, max_new_tokens): generate a further turn from ``text`` (before the chat template)
Ask = Callable[[str, int], dict]


class TaskConfigError(ValueError):
    """A bad ``benchmark`` value; the runner reports it as a config error naming the key."""


class Task:
    """One benchmark. ``name`` is its ``benchmark.name``."""

    name: str

    def check(self, bench: dict) -> None:
        """Refuse, before the model loads, a ``bench`` that cannot run: a
        :class:`TaskConfigError` naming the key."""

    def hub_data(self, bench: dict) -> list[tuple[str, str, str]]:
        """The hub datasets the samples would load, each ``(key, repo_id, how)``: no file is given
        at ``benchmark.data.<key>``, so ``datasets`` fetches ``repo_id``; ``how`` says how to supply
        the file. The runner refuses, before the model loads, one that cannot be had
        (:func:`eval.tasks.common.hub_refusal`). Default: none."""
        return []

    def lengths(self, bench: dict) -> list:
        """The target prompt lengths (tokens) the samples are made to, which the runner checks
        are positive ints within the model's context; [] when the data fixes the lengths."""
        return []

    def samples(self, bench: dict, fmt: PromptFormat) -> list[dict]:
        """Every sample of the job, its prompt rendered with ``fmt`` (:func:`make_sample`)."""
        raise NotImplementedError

    def second_turn(self, sample: dict, first: dict, ask: Ask) -> dict:
        """The generation to score after the first turn's ``first`` (a line's generation fields,
        ``prediction`` included); ``ask`` runs another turn. Default: ``first`` itself."""
        return first

    def score(self, sample: dict, prediction: str) -> tuple[float, dict]:
        """The official metric of the sample's task, and extra fields for its line."""
        raise NotImplementedError

    def aggregate(self, lines: Sequence[dict]) -> dict | None:
        """A benchmark-level breakdown of the job's lines (kept under the task's name in the
        job's metrics), or None; per (task, length) cells are the runner's."""
        return None


def make_sample(raw: dict, prompt: str, max_new_tokens: int, keep: tuple[str, ...] = ()) -> dict:
    """A runner's sample from a generator's or loader's ``raw`` one (``outputs`` is the gold),
    with the ``keep`` fields that ``raw`` has."""
    return {"id": raw["id"], "task": raw["task"], "length": raw.get("length"), "prompt": prompt,
            "gold": raw["outputs"], "max_new_tokens": int(max_new_tokens),
            **{k: raw[k] for k in keep if k in raw}}  # fmt: skip


TASKS: dict[str, Task] = {}


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: the benchmark's task, under its ``name``."""
    TASKS[cls.name] = cls()
    return cls


def _import_all() -> None:
    """Import every module of this package: each benchmark's module registers its task."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")


def names() -> list[str]:
    """The registered benchmark names, sorted."""
    _import_all()
    return sorted(TASKS)


def get(name: str) -> Task:
    """The task registered as ``name``; an unknown name raises naming the valid ones."""
    valid = names()
    if name not in TASKS:
        raise TaskConfigError(f"benchmark.name={name!r} is not one of {', '.join(valid)}")
    return TASKS[name]
