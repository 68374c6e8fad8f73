"""InfiniteBench (Zhang et al. 2024): the paper's 9 tasks, loaded from the hub or a local folder of
the official jsonl files, with the official prompts, middle truncation, generation lengths and
per-task metrics (OpenBMB/InfiniteBench ``src/prompt.py``, ``src/eval_utils.py``,
``src/compute_scores.py``); plus offline generators of passkey-, number- and KV-style samples with
the official recipe (``data/construct_synthetic_dataset.py``) and of Math.Find-style samples (no
official generator is published: see :func:`_math_find_example`), which are *not* the published
sets.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import metrics
from .base import Task, TaskConfigError, make_sample, register
from .common import check_fields, iter_jsonl, local_or_hub, truncate_middle
from .ruler.common import PromptFormat, fit_size

HUB_ID = "xinrongzhang2022/InfiniteBench"

# the paper's names -> the official file / split names
PAPER_TASKS = {
    "En.Sum": "longbook_sum_eng",
    "En.QA": "longbook_qa_eng",
    "En.MC": "longbook_choice_eng",
    "En.Dia": "longdialogue_qa_eng",
    "Zh.QA": "longbook_qa_chn",
    "Code.Debug": "code_debug",
    "Math.Find": "math_find",
    "Retr.PassKey": "passkey",
    "Retr.Number": "number_string",
}
# generated offline with the official recipe; never reported as the published tasks
GENERATED_TASKS = {
    "passkey-style": "passkey",
    "number-style": "number_string",
    "kv-style": "kv_retrieval",
    "math-find-style": "math_find",
}

MAX_NEW_TOKENS = {
    "passkey": 6,
    "number_string": 12,
    "kv_retrieval": 50,
    "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40,
    "longbook_qa_eng": 40,
    "longbook_qa_chn": 40,
    "longdialogue_qa_eng": 40,
    "math_find": 3,
    "math_calc": 30000,
    "code_run": 5,
    "code_debug": 5,
}

METRICS: dict[str, Callable[[str, Any], float]] = {
    "passkey": metrics.passkey_match,
    "number_string": metrics.number_string_match,
    "kv_retrieval": metrics.kv_retrieval_match,
    "longbook_sum_eng": metrics.rouge_lsum,
    "longbook_choice_eng": metrics.choice_match,
    "longbook_qa_eng": metrics.qa_f1,
    "longbook_qa_chn": metrics.qa_f1_zh,
    "longdialogue_qa_eng": metrics.dialogue_match,
    "math_find": metrics.math_find_match,
    "code_run": metrics.code_run_match,
    "code_debug": metrics.code_debug_match,
}

# Prompt families: open models (Yarn-Mistral, Yi-200K, ChatGLM3) use "yarn_mistral", a completion
# prompt ending in an answer cue; "gpt4" is the instruction style of the chat models.
TEMPLATES = {
    "yarn_mistral": {
        "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",  # noqa: E501
        "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",  # noqa: E501
        "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",  # noqa: E501
        "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
        "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",  # noqa: E501
        "longbook_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}\nAnswer:",  # noqa: E501
        "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
        "math_find": "{prefix}\n\n{context}\n\n{input}",
        "code_debug": "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe correct option is:",  # noqa: E501
        "longdialogue_qa_eng": 'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and you should try to guess who that character is.\n\n{context}\n\nThe name that has been replaced with $$MASK$$ is likely',  # noqa: E501
    },
    "gpt4": {
        "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.\n\n{context}\n\n{input}",  # noqa: E501
        "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n{context}\n\n{input}",  # noqa: E501
        "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",  # noqa: E501
        "longbook_qa_eng": "Read the book below and answer a question.\n\n{context}\n\nQuestion: {question}\n\nBe very concise.",  # noqa: E501
        "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n\nOnly one of the following options is correct, tell me the answer using one single letter (A, B, C, or D). Don't say anything else.\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}",  # noqa: E501
        "longbook_sum_eng": "Summarize the following book.\n\n{context}",
        "longbook_qa_chn": "请根据以下书籍回答我的问题。\n\n{context}\n\n问题：{question}\n请尽量简短地回答。",  # noqa: E501
        "math_find": "{prefix}\n\n{context}\n\n{input}",
        "code_debug": "There is ONLY ONE function in the large project that is deliberately made to include an obvious error. Please find the function that contains the most obvious errors. I will give you four options to narrow your scope. You can inspect the options and think. Eventually, tell me the answer using one single letter (A, B, C, or D).\n\n{context}\n\nWhich funtion has deliberate error?\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nYou should first find the functions in the options. Repeat their content, inspect through code, and at last give me your answer for the function that has the deliberate and obvious error in A, B, C, or D.",  # noqa: E501
        "longdialogue_qa_eng": 'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and you should try to guess who that character is.\n\nThe dialogue:\n\n---\n\n{context}\n\n---\n\nEnd of dialogue.\n\nWhich character is most likely "$$MASK$$"? Just say the name used by the scriptwriter (before the colon marks) of one single character and nothing else.',  # noqa: E501
    },
}

_MC = {"longbook_choice_eng", "code_debug"}

# The answer cue that ends each completion prompt of the "yarn_mistral" family: the template's
# text after its last field ("The pass key is", "Answer:"; none where the prompt ends with the
# task's own input). A base model continues it as written. With a chat template the prompt
# becomes a user turn and the model answers in a fresh assistant turn; it restates the cue ("The
# pass key is 1" in 6 tokens, Qwen writing one token per digit) and runs out of the official
# budget before the answer. So for a chat model the cue opens the assistant turn: RULER's
# answer-prefix convention. (The "gpt4" family's prompts end with instructions, not cues.)
ANSWER_CUES = {
    "yarn_mistral": {
        name: cue
        for name, template in TEMPLATES["yarn_mistral"].items()
        if (cue := template.rsplit("}", 1)[-1].strip())
    },
}


def split_cue(prompt: str, name: str, family: str) -> tuple[str, str]:
    """``(user text, answer prefix)`` of a chat model's prompt: the family's answer cue moved out
    of the user turn (the whitespace before it dropped); ``(prompt, "")`` where there is none."""
    cue = ANSWER_CUES.get(family, {}).get(name)
    if cue is None:
        return prompt, ""
    if not prompt.endswith(cue):
        raise ValueError(f"InfiniteBench {name} ({family}): the prompt does not end with {cue!r}")
    return prompt[: -len(cue)].rstrip(), cue


def data_name(task: str) -> str:
    """Official file name of a paper task, a generated task, or an official name itself."""
    if task in PAPER_TASKS:
        return PAPER_TASKS[task]
    if task in GENERATED_TASKS:
        return GENERATED_TASKS[task]
    if task in MAX_NEW_TOKENS:
        return task
    raise KeyError(
        f"unknown InfiniteBench task {task!r}; paper tasks: {list(PAPER_TASKS)}, "
        f"generated: {list(GENERATED_TASKS)}"
    )


def build_prompt(eg: dict, name: str, family: str = "yarn_mistral") -> str:
    """The official prompt of one example (``create_prompt``), before any chat template."""
    if family not in TEMPLATES:
        raise KeyError(f"unknown InfiniteBench prompt family {family!r}; known: {list(TEMPLATES)}")
    template = TEMPLATES[family][name]
    fields: dict[str, Any] = {"context": eg["context"], "input": eg.get("input", "")}
    if name in _MC:
        fields.update({f"OPTION_{c}": o for c, o in zip("ABCD", eg["options"])})
    if name.startswith("longbook_") and name != "longbook_sum_eng":
        fields["question"] = eg["input"]
    if name == "math_find":  # "What is the largest number in the following list?"
        found = re.findall(r"The .+ of", eg["input"])
        if not found:
            raise ValueError(f"math_find input has no 'The ... of': {eg['input']!r}")
        fields["prefix"] = f"What is {found[0].lower()[:-3]} in the following list?"
    return template.format(**fields)


def gold(eg: dict, name: str) -> Any:
    """The label the official scorer compares with (``get_answer``): ``[answer text, letter]`` for
    the choice tasks, a number for Math.Find, the answer list otherwise."""
    answer = eg["answer"]
    if name in _MC:
        text = answer if isinstance(answer, str) else answer[0]
        if isinstance(answer, list) and len(answer) == 2 and answer[1] in ("A", "B", "C", "D"):
            return list(answer)
        return [text, "ABCD"[eg["options"].index(text)]]
    if name == "math_find":
        value = answer[0] if isinstance(answer, list) else answer
        if isinstance(value, str):  # the hub schema stores answers as strings
            value = int(value) if re.fullmatch(r"-?\d+", value.strip()) else float(value)
        return value
    return answer if isinstance(answer, list) else [answer]


def score(task: str, prediction: str, label: Any) -> float:
    """The official metric of ``task`` on one prediction, in [0, 1]."""
    return float(METRICS[data_name(task)](prediction, label))


# ---------------------------------------------------------------- loading

_FIELDS = {"context": (str,), "input": (str,), "answer": (list, str, int, float)}


def load_local(folder: str | Path, task: str) -> list[dict]:
    """Examples of ``task`` from ``<folder>/<official name>.jsonl`` (the official files)."""
    name = data_name(task)
    path = Path(folder) / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: put InfiniteBench's {name}.jsonl there (hub dataset {HUB_ID})"
        )
    out = []
    for lineno, eg in iter_jsonl(path):
        where = f"{path}:{lineno}"
        check_fields(eg, _FIELDS, where)
        if name in _MC:
            check_fields(eg, {"options": (list,)}, where)
            if len(eg["options"]) != 4:
                raise ValueError(f"{where}: {name} needs 4 options, got {len(eg['options'])}")
        try:
            label = gold(eg, name)
        except (ValueError, IndexError) as e:
            raise ValueError(f"{where}: answer not usable ({e})") from e
        out.append(dict(eg, _label=label, _where=where))
    return out


def load_hub(task: str) -> list[dict]:
    """Examples of ``task`` from the hub, with the explicit features the maintainers give (plain
    ``load_dataset`` fails on a column cast: OpenBMB/InfiniteBench issue #19)."""
    import datasets

    name = data_name(task)
    features = datasets.Features(
        {
            "id": datasets.Value("int64"),
            "context": datasets.Value("string"),
            "input": datasets.Value("string"),
            "answer": datasets.Sequence(datasets.Value("string")),
            "options": datasets.Sequence(datasets.Value("string")),
        }
    )
    rows = datasets.load_dataset(HUB_ID, features=features, split=name)
    return [
        dict(r, _label=gold(r, name), _where=f"{HUB_ID}:{name}:{i}") for i, r in enumerate(rows)
    ]


def load(task: str, data_dir: str | Path | None = None, n: int | None = None) -> list[dict]:
    """The first ``n`` (all when None) examples, from ``data_dir`` or else the hub."""
    if task in GENERATED_TASKS:
        raise ValueError(f"{task} is generated: use generate_retrieval")
    hint = (
        f"InfiniteBench {task}: no benchmark.data.dir; download the jsonl files of {HUB_ID} and "
        "set benchmark.data.dir=DIR in conf/local/"
    )
    local = (lambda: load_local(data_dir, task)) if data_dir else None
    return local_or_hub(local, lambda: load_hub(task), hint, n)


def to_samples(
    rows: list[dict],
    task: str,
    tokenizer: Any,
    max_len: int | None,
    family: str = "yarn_mistral",
    render: Callable[[str], str] = lambda s: s,
    chat: bool = False,
) -> list[dict]:
    """Benchmark samples: the official prompt truncated in the middle to ``max_len`` tokens
    (before the chat template, as the official scripts do), then ``render``-ed; with ``chat`` (a
    chat template) the answer cue goes after it (:func:`split_cue`)."""
    name = data_name(task)
    out = []
    for i, eg in enumerate(rows):
        text, n_before, cut = truncate_middle(tokenizer, build_prompt(eg, name, family), max_len)
        text, prefix = split_cue(text, name, family) if chat else (text, "")
        out.append(
            dict(
                id=f"infinitebench/{task}/{eg.get('id', i)}",
                task=task,
                index=i,
                input=render(text),
                answer_prefix=prefix,
                outputs=eg["_label"] if "_label" in eg else gold(eg, name),
                max_new_tokens=MAX_NEW_TOKENS[name],
                prompt_family=family,
                tokens_before_truncation=n_before,
                truncated=cut,
            )
        )
    return out


# ---------------------------------------------------------------- passkey- and number-style

NOISE_LINE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
)
NEEDLES = {
    "passkey": (
        "The pass key is {key}. Remember it. {key} is the pass key.\n",
        "What is the pass key?",
    ),
    "number_string": (
        "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n",
        "What is the sequence of digits?",
    ),
}


def _key(name: str, rng: random.Random) -> str:
    digits = [str(rng.randint(0, 9)) for _ in range(5)]
    if name == "number_string":  # 10 digits: each of 5 insertions repeats a digit in place
        for k in range(5):
            pos = rng.randint(0, 5 + k - 1)
            digits.insert(pos, digits[pos])
    return "".join(digits)


def _retrieval_example(name: str, num_noise: int, depth: int, key: str) -> dict:
    needle, question = NEEDLES[name]
    context = NOISE_LINE * depth + needle.replace("{key}", key) + NOISE_LINE * (num_noise - depth)
    return {"context": context, "input": question, "answer": [key]}


def generate_retrieval(
    task: str,
    length: int,
    fmt: PromptFormat,
    n: int,
    seed: int = 42,
    family: str = "yarn_mistral",
    repeats: int = 1,
) -> list[dict]:
    """``n`` passkey-style or number-style samples at ``length`` tokens (prompt after ``fmt``'s
    template + tokens to generate): the official noise and needle lines, the needle at evenly
    stepped line depths from the top to the bottom, ``repeats`` keys per depth."""
    if task not in GENERATED_TASKS:
        raise KeyError(f"generate_retrieval makes {list(GENERATED_TASKS)}, not {task!r}")
    name = GENERATED_TASKS[task]
    if name in DRAWN:
        return generate_drawn(task, length, fmt, n, seed, family)
    budget = length - MAX_NEW_TOKENS[name]

    def prompt(eg: dict) -> tuple[str, str]:  # (rendered input, answer prefix)
        text = build_prompt(eg, name, family)
        text, prefix = split_cue(text, name, family) if fmt.chat else (text, "")
        return fmt.render(text), prefix

    def n_tokens(num_noise: int) -> int:
        eg = _retrieval_example(name, num_noise, 0, "9" * (10 if name == "number_string" else 5))
        return fmt.n_tokens("".join(prompt(eg)))

    num_noise = fit_size(n_tokens, budget, 1, budget // 25)
    rng = random.Random(seed)
    n_depths = max(1, -(-n // repeats))
    out = []
    for i in range(n):
        d = i // repeats
        depth = round(num_noise * d / (n_depths - 1)) if n_depths > 1 else num_noise // 2
        eg = _retrieval_example(name, num_noise, depth, _key(name, rng))
        text, prefix = prompt(eg)
        out.append(_sample(task, length, seed, i, text, prefix, eg["answer"], name, family, fmt,
                           depth / num_noise))  # fmt: skip
    return out


def _sample(task, length, seed, i, text, prefix, outputs, name, family, fmt, depth) -> dict:
    """One generated sample's row (both generated-task families write the same fields)."""
    return dict(
        id=f"infinitebench/{task}/{length}/{seed}/{i}",
        task=task,
        index=i,
        length=length,
        input=text,
        answer_prefix=prefix,
        outputs=outputs,
        max_new_tokens=MAX_NEW_TOKENS[name],
        prompt_family=family,
        prompt_tokens=fmt.n_tokens(text + prefix),
        depth=depth,
    )


# ---------------------------------------------------------------- KV- and Math.Find-style


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _kv_example(pairs: list[tuple[str, str]], at: int) -> dict:
    """The official KV layout: a JSON object of UUID keys and values after "JSON data:", the
    question naming the key of pair ``at``; the answer its value."""
    body = ", ".join(f'"{k}": "{v}"' for k, v in pairs)
    question = f'Key: "{pairs[at][0]}"\nThe value associated with the specified key is: '
    return {"context": "JSON data:\n{" + body + "}", "input": question, "answer": [pairs[at][1]]}


MATH_FIND_KINDS = ("largest", "smallest", "median")


def _math_find_example(values: list[int], kind: str) -> dict:
    """A list of integers and the question for its largest, smallest or median value (an odd
    number of values: the median is one of them). The official repository publishes no Math.Find
    generator (the maintainers say it is auto-generated, OpenBMB/InfiniteBench issue #8); the
    list and question follow the shape the official prompt code reads (``"The <kind> number"``
    in the input, the context a list), values of at most 3 digits so that the answer fits the
    official 3-token budget. The value ranges are ours."""
    pick = {"largest": max, "smallest": min, "median": lambda v: sorted(v)[len(v) // 2]}
    context = "[" + ", ".join(map(str, values)) + "]"
    question = f"The {kind} number of the list is: "
    return {"context": context, "input": question, "answer": [pick[kind](values)]}


# the generated tasks whose every sample draws its own material (fitted to the budget one by one)
DRAWN = {"kv_retrieval", "math_find"}


def _check_cap(k: int, cap: int) -> None:
    if k > cap:  # past the drawn material the prompt stops growing: the fit would never end
        raise ValueError(f"size {k} is past the {cap} drawn: the tokenizer packs more per token")


def _drawn_example(name: str, i: int, n: int, rng: random.Random, cap: int):
    """``(example at size k, depth of the answer at size k)`` for sample ``i`` of ``n``: its
    material drawn once up to ``cap`` (so the fitted size only cuts it), the answer's place
    evenly stepped over the samples (KV: the answer pair's position; Math.Find: the kinds in
    turn)."""
    frac = i / (n - 1) if n > 1 else 0.5
    if name == "kv_retrieval":
        pairs = [(_uuid(rng), _uuid(rng)) for _ in range(cap)]

        def kv(k: int) -> tuple[dict, float]:
            _check_cap(k, cap)
            at = round(frac * (k - 1))
            return _kv_example(pairs[:k], at), at / max(1, k - 1)

        return kv
    kind = MATH_FIND_KINDS[i % len(MATH_FIND_KINDS)]
    lo = rng.randint(0, 499)
    hi = rng.randint(lo + 100, 999)
    values = [rng.randint(lo, hi) for _ in range(2 * cap + 1)]

    def math(k: int) -> tuple[dict, float]:
        _check_cap(k, cap)
        eg = _math_find_example(values[: 2 * k + 1], kind)
        return eg, values.index(eg["answer"][0]) / (2 * k)

    return math


def generate_drawn(
    task: str, length: int, fmt: PromptFormat, n: int, seed: int = 42,
    family: str = "yarn_mistral",
) -> list[dict]:  # fmt: skip
    """``n`` KV-style or Math.Find-style samples at ``length`` tokens (prompt after ``fmt``'s
    template + tokens to generate), each sample's own draw fitted to the budget (KV pairs; list
    values, kept odd in number)."""
    name = GENERATED_TASKS[task]
    budget = length - MAX_NEW_TOKENS[name]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # at least a token per KV pair's 4 quotes, per listed value: the cap is past the budget
        cap = max(4, budget // 4 if name == "kv_retrieval" else budget)
        make = _drawn_example(name, i, n, rng, cap)

        def prompt(k: int, make=make) -> tuple[str, str]:
            text = build_prompt(make(k)[0], name, family)
            text, prefix = split_cue(text, name, family) if fmt.chat else (text, "")
            return fmt.render(text), prefix

        size = fit_size(lambda k: fmt.n_tokens("".join(prompt(k))), budget, 1, budget // 64)
        eg, depth = make(size)
        text, prefix = prompt(size)
        out.append(_sample(task, length, seed, i, text, prefix,
                           gold(eg, name) if name == "math_find" else eg["answer"], name, family,
                           fmt, depth))  # fmt: skip
    return out


# ---------------------------------------------------------------- the benchmark task


@register
class InfiniteBench(Task):
    """InfiniteBench as a benchmark task: the loaded tasks truncated to ``benchmark.max_len``, the
    generated ones made to ``benchmark.lengths``; each task's official metric (:func:`score`)."""

    name = "infinitebench"

    def check(self, bench: dict) -> None:
        for task in bench.get("tasks") or []:
            try:
                data_name(task)
            except KeyError as e:
                raise TaskConfigError(f"benchmark.tasks: {e.args[0]}") from None

    def hub_data(self, bench: dict) -> list[tuple[str, str, str]]:
        """The hub set when a task that is not generated has no ``benchmark.data.dir``."""
        loaded = [t for t in bench.get("tasks") or [] if t not in GENERATED_TASKS]
        if not loaded or dict(bench.get("data") or {}).get("dir"):
            return []
        files = ", ".join(f"{data_name(t)}.jsonl" for t in loaded)
        how = f"download {files} of {HUB_ID} into DIR and set benchmark.data.dir=DIR in conf/local/"
        return [("dir", HUB_ID, how)]

    def lengths(self, bench: dict) -> list:
        tasks = list(bench.get("tasks") or [])
        return list(bench["lengths"]) if any(t in GENERATED_TASKS for t in tasks) else []

    def samples(self, bench: dict, fmt: PromptFormat) -> list[dict]:
        n, seed, data = bench["n"], bench["seed"], dict(bench.get("data") or {})
        family, out = bench["prompt_family"], []
        for task in bench["tasks"]:
            if task in GENERATED_TASKS:
                if n is None:
                    raise TaskConfigError(f"{task} is generated: give benchmark.n=<int>")
                for length in bench["lengths"]:
                    rows = generate_retrieval(task, length, fmt, n, seed, family, bench["repeats"])
                    out += [make_sample(s, s["input"] + s["answer_prefix"], s["max_new_tokens"])
                            for s in rows]  # fmt: skip
                continue
            rows = load(task, data.get("dir"), n)
            for s in to_samples(
                rows, task, fmt.tokenizer, bench["max_len"], family, fmt.render, fmt.chat
            ):
                prompt = s["input"] + s["answer_prefix"]
                out.append(make_sample(dict(s, length=None), prompt, s["max_new_tokens"]))
        return out

    def score(self, sample: dict, prediction: str) -> tuple[float, dict]:
        return score(sample["task"], prediction, sample["gold"]), {}
