"""LongBench v2 (Bai et al. 2024): 503 four-choice questions over 8K-2M-word contexts, from the
hub or a local ``data.json``; the official zero-shot prompt (CoT optional), middle truncation,
answer extraction and the accuracy breakdown by difficulty and length (THUDM/LongBench
``prompts/*.txt``, ``pred.py``, ``result.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..metrics import extract_choice
from ..significance import score_interval
from .base import Ask, Task, make_sample, register
from .common import check_fields, iter_jsonl, local_or_hub, truncate_middle

HUB_ID = "THUDM/LongBench-v2"
MAX_NEW_TOKENS = 128
MAX_NEW_TOKENS_COT = 1024

PROMPT_0SHOT = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n"
    '(D) $C_D$\n\nFormat your response as follows: "The correct answer is (insert answer here)".'
)
PROMPT_0SHOT_COT = (
    "Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n"
    "(D) $C_D$\n\nLet\u2019s think step by step:"
)
PROMPT_0SHOT_COT_ANSWER = (
    "Please read the following text and answer the questions below.\n\nThe text is too long and "
    "omitted here.\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n"
    "(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nLet\u2019s think step by step: $COT$\n\n"
    "Based on the above, "
    'what is the single, most likely answer choice? Format your response as follows: "The '
    'correct answer is (insert answer here)".'
)

_FIELDS = {
    "_id": (str,),
    "difficulty": (str,),
    "length": (str,),
    "question": (str,),
    "choice_A": (str,),
    "choice_B": (str,),
    "choice_C": (str,),
    "choice_D": (str,),
    "answer": (str,),
    "context": (str,),
}
DIFFICULTIES = ("easy", "hard")
LENGTHS = ("short", "medium", "long")


def _fill(template: str, item: dict, cot: str | None = None) -> str:
    # the official order of replacements; every field stripped first
    text = template.replace("$DOC$", item["context"].strip()).replace(
        "$Q$", item["question"].strip()
    )
    for c in "ABCD":
        text = text.replace(f"$C_{c}$", item[f"choice_{c}"].strip())
    return text if cot is None else text.replace("$COT$", cot)


def build_prompt(item: dict, cot: bool = False) -> str:
    """The official zero-shot prompt (``prompts/0shot.txt``; ``0shot_cot.txt`` with ``cot``)."""
    return _fill(PROMPT_0SHOT_COT if cot else PROMPT_0SHOT, item)


COT_FIELDS = ("question", "choice_A", "choice_B", "choice_C", "choice_D")


def build_cot_answer_prompt(item: dict, cot_response: str) -> str:
    """The second CoT turn (``prompts/0shot_cot_ans.txt``): the reasoning, asked for the answer.
    The document is not in this prompt (the template says it is omitted), so ``item`` needs only
    the question and the choices (:data:`COT_FIELDS`)."""
    return _fill(PROMPT_0SHOT_COT_ANSWER, {"context": "", **item}, cot_response.strip())


def _validate(item: Any, where: str) -> dict:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
    check_fields(item, _FIELDS, where)
    if item["answer"] not in ("A", "B", "C", "D"):
        raise ValueError(f"{where}: answer {item['answer']!r} is not one of A-D")
    if item["difficulty"] not in DIFFICULTIES or item["length"] not in LENGTHS:
        raise ValueError(
            f"{where}: difficulty/length {item['difficulty']!r}/{item['length']!r} "
            f"not in {DIFFICULTIES}/{LENGTHS}"
        )
    return item


def load_local(path: str | Path) -> list[dict]:
    """Items of the official ``data.json`` (a JSON array), or a jsonl file of the same objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: download data.json of the hub dataset "
            f"{HUB_ID} and set benchmark.data.path in conf/local/"
        )
    if path.suffix == ".jsonl":
        return [_validate(obj, f"{path}:{ln}") for ln, obj in iter_jsonl(path)]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from e
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of items, got {type(data).__name__}")
    return [_validate(item, f"{path}: item {i}") for i, item in enumerate(data)]


def load_hub() -> list[dict]:
    import datasets

    rows = datasets.load_dataset(HUB_ID, split="train")
    return [
        _validate(
            {k: r[k] for k in _FIELDS | {"domain": 0, "sub_domain": 0} if k in r},
            f"{HUB_ID}: item {i}",
        )
        for i, r in enumerate(rows)
    ]


def load(path: str | Path | None = None, n: int | None = None) -> list[dict]:
    hint = f"LongBench v2: no benchmark.data.path; download data.json of {HUB_ID}"
    return local_or_hub((lambda: load_local(path)) if path else None, load_hub, hint, n)


def to_samples(
    items: list[dict],
    tokenizer: Any,
    max_len: int | None,
    cot: bool = False,
    render: Callable[[str], str] = lambda s: s,
) -> list[dict]:
    """Samples with the filled prompt truncated in the middle to ``max_len`` tokens (the whole
    filled prompt, as ``pred.py``), then ``render``-ed as one user message."""
    out = []
    for i, item in enumerate(items):
        text, n_before, cut = truncate_middle(tokenizer, build_prompt(item, cot), max_len)
        out.append(
            dict(
                id=f"longbench_v2/{item['_id']}",
                task=item.get("domain", "longbench_v2"),
                index=i,
                input=render(text),
                answer_prefix="",
                outputs=item["answer"],
                max_new_tokens=MAX_NEW_TOKENS_COT if cot else MAX_NEW_TOKENS,
                difficulty=item["difficulty"],
                length_bucket=item["length"],
                cot=cot,
                cot_item={k: item[k] for k in COT_FIELDS} if cot else None,
                tokens_before_truncation=n_before,
                truncated=cut,
            )
        )
    return out


def judge(response: str, answer: str) -> dict:
    pred = extract_choice(response.strip())
    return {"pred": pred, "judge": pred == answer}


def aggregate(records: Sequence[dict], compensated: bool = False) -> dict:
    """Accuracy (x100) overall, by difficulty and by length, each with n and a 95% Wilson interval.
    ``records`` need ``judge`` (bool), ``pred``, ``difficulty`` and ``length`` (or
    ``length_bucket``); ``compensated`` counts an unparsable answer as 0.25 (``result.py``)."""

    def acc(r):
        return 0.25 if compensated and r.get("pred") is None else float(bool(r["judge"]))

    groups: dict[str, list[float]] = {"overall": []}
    for r in records:
        s = acc(r)
        groups["overall"].append(s)
        groups.setdefault(r["difficulty"], []).append(s)
        groups.setdefault(r.get("length_bucket", r.get("length")), []).append(s)
    out = {}
    for name in ("overall", *DIFFICULTIES, *LENGTHS):
        scores = groups.get(name, [])
        ci = (
            score_interval(scores)
            if scores
            else {"mean": float("nan"), "n": 0, "lo": float("nan"), "hi": float("nan")}
        )
        out[name] = {
            "accuracy": 100 * ci["mean"],
            "n": ci["n"],
            "lo": 100 * ci["lo"],
            "hi": 100 * ci["hi"],
        }
    return out


# ---------------------------------------------------------------- the benchmark task


@register
class LongBenchV2(Task):
    """LongBench v2 as a benchmark task: the official prompt (CoT with ``benchmark.cot``, then the
    answer turn), the extracted choice as the score, the breakdown of :func:`aggregate`."""

    name = "longbench_v2"

    def hub_data(self, bench: dict) -> list[tuple[str, str, str]]:
        if dict(bench.get("data") or {}).get("path"):
            return []
        how = f"download data.json of {HUB_ID} and set benchmark.data.path=FILE in conf/local/"
        return [("path", HUB_ID, how)]

    def samples(self, bench: dict, fmt) -> list[dict]:
        items = load(dict(bench.get("data") or {}).get("path"), bench["n"])
        cot = bool(bench.get("cot"))
        keep = ("difficulty", "length_bucket", "cot_item")
        return [
            make_sample(dict(s, length=None), s["input"], s["max_new_tokens"], keep)
            for s in to_samples(items, fmt.tokenizer, bench["max_len"], cot, fmt.render)
        ]

    def second_turn(self, sample: dict, first: dict, ask: Ask) -> dict:
        """CoT: the second turn asks for the answer given the first turn's reasoning (a short
        prompt without the document). The sample's density is the first, long prefill's; the
        times add up both turns."""
        if not sample.get("cot_item"):
            return first
        second = ask(build_cot_answer_prompt(sample["cot_item"], first["prediction"]),
                     MAX_NEW_TOKENS)  # fmt: skip
        add = lambda k: None if first[k] is None or second[k] is None else first[k] + second[k]
        return {
            **first, "prediction": second["prediction"], "cot_response": first["prediction"],
            "new_tokens": first["new_tokens"] + second["new_tokens"],
            "prefill_ms": add("prefill_ms"), "decode_ms": add("decode_ms"),
            "answer_turn_prompt_tokens": second["prompt_tokens"],
        }  # fmt: skip

    def score(self, sample: dict, prediction: str) -> tuple[float, dict]:
        judged = judge(prediction, sample["gold"])
        return float(judged["judge"]), {"pred": judged["pred"], "difficulty": sample["difficulty"],
                                        "length_bucket": sample["length_bucket"]}  # fmt: skip

    def aggregate(self, lines: Sequence[dict]) -> dict:
        return aggregate([dict(r, judge=bool(r["score"]), pred=r.get("pred")) for r in lines])
