"""InfiniteBench: loaders read files in the official jsonl format, official prompts, middle
truncation, per-task scoring, errors naming file and line, and the passkey-/number-style
generators."""

from __future__ import annotations

import json

import pytest

from eval.tasks import infinitebench as ib
from eval.tasks.common import truncate_middle
from eval.tasks.ruler import PromptFormat

CHAT = "<|user|>\n{}<|end|>\n<|assistant|>\n"


@pytest.fixture(scope="module")
def tok():
    from test_ruler import bpe_tokenizer

    return bpe_tokenizer()


def _row(**kw):
    row = {"id": 0, "context": "Some long context.", "input": "", "answer": ["x"], "options": []}
    row.update(kw)
    return row


ROWS = {
    "passkey": _row(
        context="noise\nThe pass key is 12345.\nnoise",
        input="What is the pass key?",
        answer=["12345"],
    ),
    "number_string": _row(input="What is the sequence of digits?", answer=["0011223344"]),
    "longbook_sum_eng": _row(answer=["A short summary of the book."]),
    "longbook_qa_eng": _row(input="Who wins?", answer=["The fox", "fox"]),
    "longbook_choice_eng": _row(
        input="Who wins?", answer=["fox"], options=["dog", "cat", "fox", "cow"]
    ),
    "longdialogue_qa_eng": _row(context="JOHN: hi\n$$MASK$$: hello", answer=["MARY"]),
    "longbook_qa_chn": _row(input="谁赢了？", answer=["狐狸"]),
    "code_debug": _row(answer="func_b", options=["func_a", "func_b", "func_c", "func_d"]),
    "math_find": _row(
        context="[3, 9, 1]",
        input="What is the largest number in the list? The largest number of the list is: ",
        answer=[9],
    ),
}


@pytest.fixture()
def data_dir(tmp_path):
    for name, row in ROWS.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n\n")
    return tmp_path


def test_every_paper_task_loads_prompts_and_scores(data_dir, tok):
    right = {
        "En.Sum": "A short summary of the book.",
        "En.QA": "the fox",
        "En.MC": "C",
        "En.Dia": "MARY",
        "Zh.QA": "狐狸",
        "Code.Debug": "B. func_b",
        "Math.Find": "9",
        "Retr.PassKey": "12345.",
        "Retr.Number": "0011223344",
    }
    for task in ib.PAPER_TASKS:
        (row,) = ib.load(task, data_dir)
        (s,) = ib.to_samples([row], task, tok, max_len=10_000, render=CHAT.format)
        assert s["max_new_tokens"] == ib.MAX_NEW_TOKENS[ib.data_name(task)]
        assert s["input"].startswith("<|user|>\n") and row["context"] in s["input"]
        assert ib.score(task, right[task], s["outputs"]) == 1.0, task
        assert ib.score(task, "", s["outputs"]) == 0.0, task


def test_official_prompts():
    passkey = ib.build_prompt(ROWS["passkey"], "passkey")
    assert passkey == (
        "There is an important info hidden inside a lot of irrelevant text. Find it "
        "and memorize it. I will quiz you about the important information.\n\n"
        "noise\nThe pass key is 12345.\nnoise\n\nWhat is the pass key?\n\n"
        "The pass key is"
    )
    mc = ib.build_prompt(ROWS["longbook_choice_eng"], "longbook_choice_eng")
    assert mc.endswith(
        "Question: Who wins?\nA. dog\nB. cat\nC. fox\nD. cow\n\nThe letter of the correct answer is"
    )
    mf = ib.build_prompt(ROWS["math_find"], "math_find")
    assert mf.startswith("What is the largest number in the following list?\n\n[3, 9, 1]\n\n")
    gpt4 = ib.build_prompt(ROWS["longbook_qa_eng"], "longbook_qa_eng", "gpt4")
    assert gpt4.endswith("Question: Who wins?\n\nBe very concise.")
    assert ib.gold(ROWS["code_debug"], "code_debug") == ["func_b", "B"]
    assert ib.gold(ROWS["longbook_choice_eng"], "longbook_choice_eng") == ["fox", "C"]
    assert ib.gold({"answer": ["7"]}, "math_find") == 7  # hub rows hold strings


def test_middle_truncation_keeps_both_ends(tok):
    row = _row(
        context=" ".join(f"w{i}" for i in range(3000)), input="What is the pass key?", answer=["1"]
    )
    (s,) = ib.to_samples([row], "Retr.PassKey", tok, max_len=301)
    n = len(tok.encode(s["input"], add_special_tokens=False))
    assert s["truncated"] and s["tokens_before_truncation"] > 301
    assert abs(n - 301) <= 3  # decode + re-encode may merge a few tokens at the seam
    assert s["input"].startswith("There is an important info") and s["input"].endswith(
        "The pass key is"
    )
    text, before, cut = truncate_middle(tok, "short", 100)
    assert (text, cut) == ("short", False)


def test_truncation_rule_exact():
    class Ids:  # token = character, to check which positions are kept
        def encode(self, t, add_special_tokens=False):
            return list(t)

        def decode(self, ids, skip_special_tokens=True):
            return "".join(ids)

    assert truncate_middle(Ids(), "abcdefghij", 5)[0] == "abhij"  # first 5//2, last 5 - 5//2
    assert truncate_middle(Ids(), "abcdefghij", 4)[0] == "abij"


def test_malformed_file_names_file_and_line(tmp_path):
    path = tmp_path / "passkey.jsonl"
    path.write_text(json.dumps(ROWS["passkey"]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"passkey.jsonl:2: not valid JSON"):
        ib.load("Retr.PassKey", tmp_path)
    path.write_text(
        json.dumps(ROWS["passkey"]) + "\n" + json.dumps({"context": "x", "answer": ["1"]}) + "\n"
    )
    with pytest.raises(ValueError, match=r"passkey.jsonl:2: missing field 'input'"):
        ib.load("Retr.PassKey", tmp_path)
    bad = dict(ROWS["longbook_choice_eng"], answer=["zebra"])
    (tmp_path / "longbook_choice_eng.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"longbook_choice_eng.jsonl:1: answer not usable"):
        ib.load("En.MC", tmp_path)
    with pytest.raises(FileNotFoundError, match="code_debug.jsonl"):
        ib.load("Code.Debug", tmp_path)


@pytest.mark.parametrize("task,digits", [("passkey-style", 5), ("number-style", 10)])
def test_generated_retrieval(task, digits, tok):
    fmt = PromptFormat(tok, render=CHAT.format, add_special_tokens=False)
    samples = ib.generate_retrieval(task, 2048, fmt, n=5, seed=3)
    name = ib.GENERATED_TASKS[task]
    depths = [s["depth"] for s in samples]
    assert depths == sorted(depths) and depths[0] == 0.0 and depths[-1] == 1.0
    for s in samples:
        (key,) = s["outputs"]
        assert len(key) == digits and key.isdigit()
        assert s["input"].count(key) == 2  # "... is {key}. Remember it. {key} is ..."
        assert s["prompt_tokens"] + ib.MAX_NEW_TOKENS[name] <= 2048
        assert s["prompt_tokens"] + ib.MAX_NEW_TOKENS[name] > 0.9 * 2048
        assert s["id"].startswith(f"infinitebench/{task}/")
        assert ib.score(task, f"{key}.", s["outputs"]) == 1.0
    assert ib.generate_retrieval(task, 2048, fmt, n=5, seed=3) == samples
    with pytest.raises(ValueError, match="generated"):
        ib.load(task, "/nowhere")


def test_every_yarn_mistral_cue_ends_its_template():
    for name, cue in ib.ANSWER_CUES["yarn_mistral"].items():
        assert ib.TEMPLATES["yarn_mistral"][name].endswith(cue), name
    # the templates without a cue are the ones whose prompt ends with the task's own input
    rest = set(ib.TEMPLATES["yarn_mistral"]) - set(ib.ANSWER_CUES["yarn_mistral"])
    assert rest == {"kv_retrieval", "math_find"}


@pytest.mark.parametrize("task,digits", [("passkey-style", 5), ("number-style", 10)])
def test_a_chat_model_gets_the_answer_cue_in_its_assistant_turn(task, digits, tok):
    """With a chat template the cue opens the assistant turn (the prompt the model continues ends
    with it); without one the completion prompt is unchanged, cue and all."""
    name = ib.GENERATED_TASKS[task]
    cue = ib.ANSWER_CUES["yarn_mistral"][name]
    chat = PromptFormat(tok, render=CHAT.format, add_special_tokens=False, chat=True)
    plain = PromptFormat(tok, render=CHAT.format, add_special_tokens=False)
    for s in ib.generate_retrieval(task, 2048, chat, n=3, seed=3):
        assert s["answer_prefix"] == cue and s["input"].endswith("<|assistant|>\n")
        user = s["input"][len("<|user|>\n") : -len("<|end|>\n<|assistant|>\n")]
        assert user.endswith(ib.NEEDLES[name][1]) and cue not in user.split("\n")[-1]
        assert s["prompt_tokens"] == chat.n_tokens(s["input"] + cue)
        assert s["prompt_tokens"] + ib.MAX_NEW_TOKENS[name] <= 2048
    for s in ib.generate_retrieval(task, 2048, plain, n=3, seed=3):
        assert s["answer_prefix"] == "" and s["input"].endswith(cue + "<|end|>\n<|assistant|>\n")
    task_ = ib.InfiniteBench()
    bench = {"n": 2, "seed": 3, "prompt_family": "yarn_mistral", "tasks": [task],
             "lengths": [2048], "repeats": 1, "max_len": None}  # fmt: skip
    (first, _) = task_.samples(bench, chat)
    assert first["prompt"].endswith("<|assistant|>\n" + cue)


def test_loaded_tasks_move_the_cue_for_a_chat_model(data_dir, tok):
    rows = ib.load("Retr.PassKey", data_dir)
    (s,) = ib.to_samples(rows, "Retr.PassKey", tok, 10_000, render=CHAT.format, chat=True)
    assert s["answer_prefix"] == "The pass key is" and s["input"].endswith("<|assistant|>\n")
    assert s["input"].rstrip().endswith("What is the pass key?<|end|>\n<|assistant|>")
    (plain,) = ib.to_samples(rows, "Retr.PassKey", tok, 10_000, render=CHAT.format)
    assert plain["answer_prefix"] == "" and "The pass key is<|end|>" in plain["input"]
    (gpt4,) = ib.to_samples(rows, "Retr.PassKey", tok, 10_000, "gpt4", CHAT.format, chat=True)
    assert gpt4["answer_prefix"] == ""  # the gpt4 family has no cue: nothing moves


UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def test_generated_kv_style(tok):
    """The official KV construction: a JSON object of distinct UUID pairs after the official
    instruction, the question naming one key, its value the answer (the official metric), the
    answer's pair stepped from the first to the last; the length fitted; the same by seed."""
    import re

    fmt = PromptFormat(tok, render=CHAT.format, add_special_tokens=False)
    samples = ib.generate_retrieval("kv-style", 2048, fmt, n=4, seed=3)
    assert [s["depth"] for s in samples] == [0.0, pytest.approx(1 / 3, abs=0.02),
                                             pytest.approx(2 / 3, abs=0.02), 1.0]  # fmt: skip
    for s in samples:
        user = s["input"][len("<|user|>\n") : -len("<|end|>\n<|assistant|>\n")]
        head = "Extract the value corresponding to the specified key in the JSON object below."
        assert user.startswith(head + "\n\nJSON data:\n{"), user[:120]
        obj, question = user[len(head) + 2 :].split("\n\n")
        pairs = json.loads(obj.removeprefix("JSON data:\n"))
        assert len(pairs) > 10 and all(re.fullmatch(UUID, x) for kv in pairs.items() for x in kv)
        assert len(set(pairs.values())) == len(pairs)
        (key,) = re.findall(rf'^Key: "({UUID})"\nThe value associated with the specified key is: $',
                            question)  # fmt: skip
        (value,) = s["outputs"]
        assert pairs[key] == value and user.count(value) == 1
        assert 0.9 * 2048 < s["prompt_tokens"] + ib.MAX_NEW_TOKENS["kv_retrieval"] <= 2048
        assert ib.MAX_NEW_TOKENS["kv_retrieval"] == 50 and s["max_new_tokens"] == 50
        assert ib.score("kv-style", f'The value is "{value}".', s["outputs"]) == 1.0
        assert ib.score("kv-style", f'"{key}"', s["outputs"]) == 0.0
    assert ib.generate_retrieval("kv-style", 2048, fmt, n=4, seed=3) == samples
    assert ib.generate_retrieval("kv-style", 2048, fmt, n=4, seed=4) != samples


def test_generated_math_find_style(tok):
    """A list of at most 3-digit integers, odd in number; the kinds in turn; the answer its
    largest, smallest or median; the official prompt (the "What is the <kind> number in the
    following list?" line the official code derives from the input) and metric; the length
    fitted; the same by seed."""
    import re

    fmt = PromptFormat(tok, render=CHAT.format, add_special_tokens=False)
    samples = ib.generate_retrieval("math-find-style", 2048, fmt, n=6, seed=3)
    for i, s in enumerate(samples):
        kind = ib.MATH_FIND_KINDS[i % 3]
        user = s["input"][len("<|user|>\n") : -len("<|end|>\n<|assistant|>\n")]
        prefix, listed, question = user.split("\n\n")
        assert prefix == f"What is the {kind} number in the following list?"
        assert re.findall(r"The \w+ number", question)[0].lower() == f"the {kind} number"
        values = json.loads(listed)
        assert len(values) % 2 == 1 and len(values) > 100 and max(values) <= 999
        want = {"largest": max(values), "smallest": min(values),
                "median": sorted(values)[len(values) // 2]}[kind]  # fmt: skip
        assert s["outputs"] == want and isinstance(want, int)
        assert 0.9 * 2048 < s["prompt_tokens"] + ib.MAX_NEW_TOKENS["math_find"] <= 2048
        assert s["max_new_tokens"] == 3
        assert ib.score("math-find-style", f"{want}", s["outputs"]) == 1.0
        assert ib.score("math-find-style", f"{want + 1}", s["outputs"]) == 0.0
    assert ib.generate_retrieval("math-find-style", 2048, fmt, n=6, seed=3) == samples


def test_generated_kv_and_math_find_through_the_task(tok):
    """The benchmark task makes and scores them as it does the other generated tasks."""
    fmt = PromptFormat(tok, render=CHAT.format, add_special_tokens=False, chat=True)
    task = ib.InfiniteBench()
    bench = {"n": 2, "seed": 3, "prompt_family": "yarn_mistral", "repeats": 1, "max_len": None,
             "tasks": ["kv-style", "math-find-style"], "lengths": [1024]}  # fmt: skip
    task.check(bench)
    assert task.lengths(bench) == [1024]
    samples = task.samples(bench, fmt)
    assert [s["task"] for s in samples] == ["kv-style"] * 2 + ["math-find-style"] * 2
    for s in samples:
        assert s["prompt"].endswith("<|assistant|>\n")  # no answer cue: nothing moves
        gold = s["gold"][0] if isinstance(s["gold"], list) else s["gold"]
        assert task.score(s, f"{gold}")[0] == 1.0 and task.score(s, "none")[0] == 0.0
