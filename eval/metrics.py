"""The official metric of every benchmark task, one function each, re-implemented from the
definitions in the benchmarks' scoring scripts (cited per function). Each returns the score of
one prediction in [0, 1]; a task's score is the mean over samples (x100 when reported).

RULER: NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` and ``scripts/eval/evaluate.py``.
InfiniteBench: OpenBMB/InfiniteBench ``src/compute_scores.py``.
LongBench v2: THUDM/LongBench ``pred.py`` (``extract_answer``) and ``result.py``.
"""

from __future__ import annotations

import re
import string
from collections import Counter

# ---------------------------------------------------------------- RULER


def ruler_postprocess(pred: str) -> str:
    """Strip, and turn control characters into newlines (RULER's ``postprocess_pred``)."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()


def string_match_all(pred: str, refs: list[str]) -> float:
    """Fraction of the gold strings found in the prediction (case-insensitive substring)."""
    p = pred.lower()
    return sum(r.lower() in p for r in refs) / len(refs)


def string_match_part(pred: str, refs: list[str]) -> float:
    """1 if any gold string is in the prediction (case-insensitive substring), else 0."""
    p = pred.lower()
    return float(max(r.lower() in p for r in refs))


def ruler_score(metric: str, pred: str, refs: list[str]) -> float:
    """A RULER sample's score: the task's metric on the post-processed prediction."""
    fn = {"string_match_all": string_match_all, "string_match_part": string_match_part}[metric]
    return fn(ruler_postprocess(pred), refs)


# ---------------------------------------------------------------- InfiniteBench


def _label(label):
    return label[0] if isinstance(label, list | tuple) else label


def first_int(pred: str) -> str:
    """The first run of digits in the prediction ('' if none)."""
    return next((x for x in re.split(r"[^0-9]", pred) if x), "")


def passkey_match(pred: str, label) -> float:
    """Retr.PassKey and Retr.Number: the first digit run equals the label (a string)."""
    return float(first_int(pred) == str(_label(label)))


number_string_match = passkey_match


def _words(pred: str, chars: str) -> list[str]:
    for c in chars:
        pred = pred.replace(c, " ")
    return pred.split()


_RETRIEVAL_SEP = ["\n", ":", '"', "'", ".", ",", "?", "!", "{", "}"]


def kv_retrieval_match(pred: str, label) -> float:
    """Retr.KV: the label is one of the prediction's words (split on ``\\n:"'.,?!{}``)."""
    return float(_label(label) in _words(pred, _RETRIEVAL_SEP))


def dialogue_match(pred: str, label) -> float:
    """En.Dia: the label is one of the prediction's upper-cased words (the label itself is not
    upper-cased, as in the official scorer: the published labels are upper-case names)."""
    words = [w.upper() for w in _words(pred.strip(), _RETRIEVAL_SEP)]
    return float(_label(label) in words)


def choice_match(pred: str, label: list[str]) -> float:
    """En.MC: ``label = [answer text, letter]``. The first character if it is A-D; else the text
    after "answer is:", "answer:", "answer is" or "option is"; else the first word that is a
    substring of "ABCD" (the official rule, kept as written)."""
    pred = pred.strip()
    if not pred:
        return 0.0
    if pred[0] in "ABCD":
        return float(pred[0] in label)
    if pred in label:
        return 1.0
    pred = _blank_out(pred, ["\n", '"', "'", ".", ",", "?", "!", "{", "}"])
    after = _after_first_prefix(pred, ["answer is:", "answer:", "answer is", "option is"])
    if after is not None:
        return float(any(after.startswith(s) for s in label))
    for word in pred.split():
        if word in "ABCD":
            return float(word in label)
    return 0.0


def code_debug_match(pred: str, label: list[str]) -> float:
    """Code.Debug: ``label = [function name, letter]``. The prediction starts with "X." or "X:",
    or the text after "answer is:", "is:", "answer:" or "correct option is:" starts with the
    letter or the function name."""
    pred = pred.strip()
    fn_name, letter = label[0], label[1]
    if pred[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    pred = _blank_out(pred, ["\n", "`", "'", '"', "-", "*", "Option", "option"])
    after = _after_first_prefix(pred, ["answer is:", "is:", "answer:", "correct option is:"])
    if after is None:
        return 0.0
    return float(after.startswith(letter) or after.startswith(fn_name))


def _blank_out(pred: str, chars: list[str]) -> str:
    """``pred`` with each of ``chars`` replaced by a space and runs of spaces squeezed."""
    for c in chars:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    return pred


def _after_first_prefix(pred: str, prefixes: list[str]) -> str | None:
    """The text after the first of ``prefixes`` (in list order) found in ``pred`` and the one
    character after it (official scorers skip it); ``""`` if nothing follows; ``None`` if no
    prefix occurs."""
    for prefix in prefixes:
        idx = pred.find(prefix)
        if idx != -1:
            return pred[idx + len(prefix) + 1 :]
    return None


def code_run_match(pred: str, label) -> float:
    """Code.Run: the last word (split on ``\\n.`'":``) parsed as an int equals the label."""
    words = _words(pred.strip(), ["\n", ".", "`", "'", '"', ":"])
    try:
        return float(bool(words) and int(words[-1]) == _label(label))
    except ValueError:
        return 0.0


def math_find_match(pred: str, label) -> float:
    """Math.Find: the first int or float in the prediction equals the label (int or float)."""
    label = _label(label)
    m = re.search(r"\d+\.\d+|\d+", pred)
    if m is None:
        return 0.0
    if isinstance(label, bool) or not isinstance(label, int | float):
        raise TypeError(f"Math.Find label must be int or float, got {type(label).__name__}")
    if isinstance(label, int) and "." in m.group(0):
        return 0.0  # the official int(...) raises here; a non-integer answer is wrong
    return float((int(m.group(0)) if isinstance(label, int) else float(m.group(0))) == label)


def math_calc_score(pred: str, label: list, gpt4: bool = False) -> float:
    """Math.Calc: leading intermediate values predicted correctly / number of values."""
    label = label[0] if isinstance(label[0], list) else label
    nums = [int(x) for x in re.split(r"[^0-9]", pred) if x]
    if gpt4:  # the official GPT-4 prompt makes it repeat the first number
        nums = nums[1:]
    count = 0
    for want, got in zip(label, nums):
        if want != got:
            break
        count += 1
    return count / len(label)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


_ZH_PUNCT = set(
    string.punctuation
    + "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～"
    + "｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)


def normalize_zh_answer(s: str) -> str:
    """Chinese normalisation: lower case, no ASCII or CJK punctuation, no whitespace."""
    return "".join("".join(ch for ch in s.lower() if ch not in _ZH_PUNCT).split())


def token_f1(pred_tokens: list, gold_tokens: list) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _golds(golds) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def qa_f1(pred: str, golds) -> float:
    """En.QA: max over gold answers of the token F1 after SQuAD normalisation."""
    p = normalize_answer(pred).split()
    return max(token_f1(p, normalize_answer(g).split()) for g in _golds(golds))


def qa_f1_zh(pred: str, golds) -> float:
    """Zh.QA: max over gold answers of the character F1 after Chinese normalisation (the scorer
    of ``compute_scores.py``; one character = one token)."""
    p = list(normalize_zh_answer(pred))
    return max(token_f1(p, list(normalize_zh_answer(g))) for g in _golds(golds))


def qa_f1_zh_jieba(pred: str, golds) -> float:
    """Zh.QA F1 over jieba words (the variant in InfiniteBench's ``eval_utils.py`` and LongBench
    v1's ``qa_f1_zh_score``; not the one ``compute_scores.py`` reports)."""
    import jieba

    def toks(s):
        return [t for t in (normalize_zh_answer(w) for w in jieba.cut(s, cut_all=False)) if t]

    return max(token_f1(toks(pred), toks(g)) for g in _golds(golds))


def rouge_lsum(pred: str, golds) -> float:
    """En.Sum: ROUGE-Lsum F-measure (``rouge-score``, no stemmer; best over references), which is
    what the official ``evaluate.load("rouge")`` call computes."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
    return max(scorer.score(g, pred)["rougeLsum"].fmeasure for g in _golds(golds))


# ---------------------------------------------------------------- LongBench v2


def extract_choice(response: str) -> str | None:
    """The letter in "The correct answer is (X)" or "The correct answer is X" (asterisks
    removed), else None (counted wrong)."""
    response = response.replace("*", "")
    m = re.search(r"The correct answer is \(([A-D])\)", response) or re.search(
        r"The correct answer is ([A-D])", response
    )
    return m.group(1) if m else None


def longbench_v2_judge(response: str, answer: str) -> float:
    return float(extract_choice(response) == answer)
