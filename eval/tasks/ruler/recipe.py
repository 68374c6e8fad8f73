"""Recipe variants of RULER's needle-in-a-haystack construction, one feature at a time, for the
recipe ablation (``conf/experiment/accuracy_recipe_ablation_*.yaml``): the same task, model and
method can keep every needle under one recipe and lose most under another, so a claim about
retrieval names its recipe.

``benchmark.data.recipe`` (all defaults: RULER's own construction, the samples unchanged):

- ``haystack``: ``noise`` (a repeated sentence per line), ``essay`` (Paul Graham essays) or
  ``needle`` (distractor needles per line) instead of the task's own; null: the task's.
- ``depth``: every needle at this depth, percent of the haystack (0-100) instead of RULER's
  random depths (the random draw still happens, so keys and values stay those of the official
  sample); null: RULER's.
- ``answer_prefix``: false ends the prompt at the question (no "The special magic number for X
  mentioned in the provided text is" for the model to continue).
- ``line_break``: false joins the noise or needle haystack's lines with a space, not a newline.

A sample made under a variant names it in its task, ``niah_single_1[depth=50]`` (and so in its id):
its cell, tables and paired tests stay apart from the official task's.
"""

from __future__ import annotations

OFFICIAL = {"haystack": None, "depth": None, "answer_prefix": True, "line_break": True}
HAYSTACKS = ("noise", "essay", "needle")


def normalize(recipe: dict | None) -> dict:
    """Every recipe key with its value (defaults filled in), validated."""
    recipe = dict(recipe or {})
    unknown = sorted(set(recipe) - set(OFFICIAL))
    if unknown:
        raise ValueError(
            f"benchmark.data.recipe: unknown key(s) {unknown}; known: {list(OFFICIAL)}"
        )
    out = {**OFFICIAL, **{k: v for k, v in recipe.items() if v is not None or k in OFFICIAL}}
    if out["haystack"] is not None and out["haystack"] not in HAYSTACKS:
        raise ValueError(f"benchmark.data.recipe.haystack={out['haystack']!r}: one of {HAYSTACKS} "
                         "or null")  # fmt: skip
    depth = out["depth"]
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or not 0 <= depth <= 100):  # fmt: skip
        raise ValueError(f"benchmark.data.recipe.depth={depth!r}: an int percent in 0..100 or null")
    for key in ("answer_prefix", "line_break"):
        if not isinstance(out[key], bool):
            raise ValueError(f"benchmark.data.recipe.{key}={out[key]!r}: true or false")
    return out


def changes(recipe: dict | None) -> dict:
    """The keys where ``recipe`` differs from RULER's construction (``{}``: official)."""
    return {k: v for k, v in normalize(recipe).items() if v != OFFICIAL[k]}


def label(task: str, recipe: dict | None) -> str:
    """``task`` for the official recipe, else ``task[key=value,...]``."""
    diff = changes(recipe)
    if not diff:
        return task
    return f"{task}[{','.join(f'{k}={_text(v)}' for k, v in sorted(diff.items()))}]"


def split(task_label: str) -> tuple[str, str | None]:
    """``("niah_single_1", "depth=50")`` from ``"niah_single_1[depth=50]"``; ``(label, None)``
    for an official task."""
    if task_label.endswith("]") and "[" in task_label:
        base, rest = task_label.split("[", 1)
        return base, rest[:-1]
    return task_label, None


def niah_args(args: dict, recipe: dict | None) -> dict:
    """A niah task's generator arguments under ``recipe`` (``make_task_text`` reads ``depth``,
    ``answer_prefix`` and ``line_break``). Refuses a feature the task's haystack lacks."""
    r = normalize(recipe)
    out = dict(args, depth=r["depth"], answer_prefix=r["answer_prefix"],
               line_break=r["line_break"])  # fmt: skip
    if r["haystack"] is not None:
        out["type_haystack"] = r["haystack"]
    if not r["line_break"] and out["type_haystack"] == "essay":
        raise ValueError("benchmark.data.recipe.line_break=false: the essay haystack has no line "
                         "breaks to drop (noise and needle haystacks do)")  # fmt: skip
    return out


def _text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
