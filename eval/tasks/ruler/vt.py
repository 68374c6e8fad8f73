"""RULER's variable tracking (``vt``): a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... hidden in
noise lines; the answer is every variable of the chain. A one-shot example with 3-letter names is
prepended, its names and value redrawn per sample (NVIDIA/RULER
``scripts/data/synthetic/variable_tracking.py``).

Randomness, as RULER: no fixed-seed shuffle (RULER's vt has none); names, values, line positions
and the example's renaming are all drawn from the sample's stream (RULER's module-level ``random``
and ``numpy.random``, seeded once). The one-shot example goes inside the question's user turn, as
RULER inserts it after the model template's opening.
"""

from __future__ import annotations

import random
import string

from .common import PromptFormat, fit_size, fitted_draws, sample_dict
from .templates import FAMILIES, NOISE

_ICL_LENGTH = 500  # the one-shot example is fitted to 500 tokens (no model template, no answer)


def _chains(rng: random.Random, num_chains: int, num_hops: int, icl: bool):
    k = 3 if icl else 5
    hops = min(10, num_hops) if icl else num_hops
    names: list[str] = []
    while len(names) < num_chains * (hops + 1):  # distinct names (RULER can repeat one)
        name = "".join(rng.choices(string.ascii_uppercase, k=k))
        if name not in names:
            names.append(name)
    all_vars, chains = [], []
    for c in range(num_chains):
        v = names[c * (hops + 1) : (c + 1) * (hops + 1)]
        value = "12345" if icl else str(rng.randint(10000, 99999))
        chains.append(
            [f"VAR {v[0]} = {value}"] + [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(hops)]
        )
        all_vars.append(v)
    return all_vars, chains


def make_task_text(args: dict, size: int, rng: random.Random, icl: bool) -> tuple[str, str, list]:
    """Task text (no answer prefix), answer prefix and the first chain's variables."""
    all_vars, chains = _chains(rng, args["num_chains"], args["num_hops"], icl)
    value = chains[0][0].split("=")[-1].strip()
    lines = [NOISE] * size
    for chain in chains:
        positions = sorted(rng.sample(range(len(lines)), len(chain)))
        for j, pos in enumerate(positions):
            lines.insert(pos + j, chain[j])
    context = "\n".join(lines).replace(". \n", ".\n")
    fam = FAMILIES["vt"]
    num_v = args["num_hops"] + 1 if not icl else min(10, args["num_hops"]) + 1
    task_text = fam.template.format(context=context, query=value)
    return task_text, fam.answer_prefix.format(num_v=num_v, query=value), all_vars[0]


def _icl_example(args: dict, fmt: PromptFormat, seed: int) -> str:
    """RULER's one-shot example: template + answer prefix + answer, sized to 500 tokens."""

    def text_at(size: int) -> str:
        task, prefix, answer = make_task_text(args, size, random.Random(f"{seed}-icl"), icl=True)
        return task + prefix + " " + " ".join(answer) + "\n"

    size = fit_size(lambda s: fmt.n_tokens(text_at(s)), _ICL_LENGTH, 5, 20)
    return text_at(size)


def _randomize_icl(example: str, num_hops: int, rng: random.Random) -> str:
    for name in example.strip().split()[-(num_hops + 1) :]:
        example = example.replace(name, "".join(rng.choices(string.ascii_uppercase, k=len(name))))
    return example.replace("12345", str(rng.randint(10000, 99999)))


def generate(args: dict, length: int, fmt: PromptFormat, n: int, seed: int) -> list[dict]:
    fam = FAMILIES["vt"]
    budget = length - fam.tokens_to_generate
    step = 5 if length < 4096 else 10
    icl = _icl_example(args, fmt, seed)

    def full(size: int, rng: random.Random) -> tuple[str, tuple]:
        task, prefix, answer = make_task_text(args, size, rng, icl=False)
        task = _randomize_icl(icl, args["num_hops"], rng) + "\n" + task
        return fmt.render(task) + prefix, (task, prefix, answer)

    probe = fmt.n_tokens(full(step, random.Random(f"{seed}-fit"))[0])
    guess = int(budget * step / max(probe, 1))
    size = fit_size(
        lambda s: fmt.n_tokens(full(s, random.Random(f"{seed}-fit"))[0]), budget, step, guess
    )

    draws = fitted_draws(n, seed, full, fmt.n_tokens, size, budget, step, "vt",
                         min_size=args["num_chains"] * (args["num_hops"] + 1))  # fmt: skip
    return [
        sample_dict(index, fmt.render(task), prefix, answer, tok, used)
        for index, (task, prefix, answer), tok, used in draws
    ]
