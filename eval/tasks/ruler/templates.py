"""RULER's task templates, answer prefixes, tokens to generate and metrics.

The strings are RULER's (NVIDIA/RULER ``scripts/data/synthetic/constants.py``, task arguments from
``scripts/synthetic.yaml``, metrics from ``scripts/eval/synthetic/constants.py``): they define the
benchmark, so they are kept character for character.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DOCUMENT = "Document {i}:\n{document}"
# 40 depths (percent) evenly spaced in [0, 100], rounded half to even as numpy.round does
DEPTHS = [round(100 * i / 39) for i in range(40)]


@dataclass(frozen=True)
class FamilyTemplate:
    template: str
    answer_prefix: str
    tokens_to_generate: int
    metric: str  # name of a function in eval.metrics


FAMILIES: dict[str, FamilyTemplate] = {
    "niah": FamilyTemplate(
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are "
        "all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
        128,
        "string_match_all",
    ),
    "vt": FamilyTemplate(
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
        "above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
        "variables are assigned the value {query}, they are: ",
        30,
        "string_match_all",
    ),
    "cwe": FamilyTemplate(
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most "
        "common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
        120,
        "string_match_all",
    ),
    "fwe": FamilyTemplate(
        "Read the following coded text and track the frequency of each coded word. Find the three "
        "most frequently appeared coded words. {context}\nQuestion: Do not provide any "
        "explanation. Please ignore the dots '....'. What are the three most frequently appeared "
        "words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
        50,
        "string_match_all",
    ),
    "qa": FamilyTemplate(
        "Answer the question based on the given documents. Only give me the answer and do not "
        "output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the "
        "question based on the given documents. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {query}",
        " Answer:",
        32,
        "string_match_part",
    ),
}


@dataclass(frozen=True)
class TaskSpec:
    family: str
    args: dict = field(default_factory=dict)


def _niah(haystack: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> TaskSpec:
    return TaskSpec(
        "niah",
        dict(
            type_haystack=haystack,
            type_needle_k=k,
            type_needle_v=v,
            num_needle_k=nk,
            num_needle_v=nv,
            num_needle_q=nq,
        ),
    )


TASKS: dict[str, TaskSpec] = {
    "niah_single_1": _niah("noise", "words", "numbers"),
    "niah_single_2": _niah("essay", "words", "numbers"),
    "niah_single_3": _niah("essay", "words", "uuids"),
    "niah_multikey_1": _niah("essay", "words", "numbers", nk=4),
    "niah_multikey_2": _niah("needle", "words", "numbers"),
    "niah_multikey_3": _niah("needle", "uuids", "uuids"),
    "niah_multivalue": _niah("essay", "words", "numbers", nv=4),
    "niah_multiquery": _niah("essay", "words", "numbers", nq=4),
    "vt": TaskSpec("vt", dict(type_haystack="noise", num_chains=1, num_hops=4)),
    "cwe": TaskSpec("cwe", dict(freq_cw=30, freq_ucw=3, num_cw=10, num_fewshot=1)),
    "fwe": TaskSpec("fwe", dict(alpha=2.0, coded_wordlen=6)),
    "qa_1": TaskSpec("qa", dict(dataset="squad")),
    "qa_2": TaskSpec("qa", dict(dataset="hotpotqa")),
}


def family_of(task: str) -> FamilyTemplate:
    if task not in TASKS:
        raise KeyError(f"unknown RULER task {task!r}; known: {sorted(TASKS)}")
    return FAMILIES[TASKS[task].family]
