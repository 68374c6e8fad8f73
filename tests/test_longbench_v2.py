"""LongBench v2: data.json / jsonl in the official format, the official prompts, middle
truncation, answer extraction and the accuracy breakdown."""

from __future__ import annotations

import json

import pytest

from eval.tasks import longbench_v2 as lb


def _item(i, answer="B", difficulty="easy", length="short"):
    return {
        "_id": f"id{i}",
        "domain": "Single-Document QA",
        "sub_domain": "Legal",
        "difficulty": difficulty,
        "length": length,
        "question": f" Question {i}? ",
        "choice_A": "alpha",
        "choice_B": "beta",
        "choice_C": "gamma",
        "choice_D": "delta",
        "answer": answer,
        "context": f"\n Context {i}.\n",
    }


def test_prompt_is_the_official_one():
    assert lb.build_prompt(_item(1)) == (
        "Please read the following text and answer the question below.\n\n<text>\nContext 1.\n"
        "</text>\n\nWhat is the correct answer to this question: Question 1?\nChoices:\n(A) alpha\n"
        '(B) beta\n(C) gamma\n(D) delta\n\nFormat your response as follows: "The correct answer '
        'is (insert answer here)".'
    )
    cot = lb.build_prompt(_item(1), cot=True)
    assert cot.startswith("Please read the following text and answer the questions below.")
    assert cot.endswith("(D) delta\n\nLet\u2019s think step by step:")
    ans = lb.build_cot_answer_prompt(_item(1), " because beta. ")
    assert "The text is too long and omitted here." in ans and "Context 1" not in ans
    assert "step by step: because beta.\n\nBased on the above" in ans


def test_load_data_json_and_samples(tmp_path):
    from test_ruler import bpe_tokenizer

    path = tmp_path / "data.json"
    path.write_text(json.dumps([_item(0), _item(1, "C", "hard", "long")]))
    items = lb.load(path)
    assert [x["_id"] for x in items] == ["id0", "id1"] and lb.load(path, n=1) == items[:1]
    tok = bpe_tokenizer()
    long_item = dict(_item(2), context=" ".join(f"w{i}" for i in range(2000)))
    s = lb.to_samples(items + [long_item], tok, max_len=200)
    assert not s[0]["truncated"] and s[2]["truncated"]
    assert s[2]["input"].startswith("Please read") and s[2]["input"].endswith(
        '(insert answer here)".'
    )
    assert (
        s[1]["outputs"] == "C" and s[1]["max_new_tokens"] == 128 and s[1]["length_bucket"] == "long"
    )
    assert lb.to_samples(items, tok, None, cot=True)[0]["max_new_tokens"] == 1024


def test_malformed_files_name_file_and_place(tmp_path):
    bad = tmp_path / "data.json"
    bad.write_text('[\n{"_id": "a",\n}\n]')
    with pytest.raises(ValueError, match=r"data.json:3: not valid JSON"):
        lb.load(bad)
    bad.write_text(json.dumps([_item(0), {k: v for k, v in _item(1).items() if k != "context"}]))
    with pytest.raises(ValueError, match=r"data.json: item 1: missing field 'context'"):
        lb.load(bad)
    bad.write_text(json.dumps([_item(0, answer="E")]))
    with pytest.raises(ValueError, match=r"item 0: answer 'E'"):
        lb.load(bad)
    jl = tmp_path / "data.jsonl"
    jl.write_text(
        json.dumps(_item(0)) + "\n" + json.dumps(dict(_item(1), difficulty="medium")) + "\n"
    )
    with pytest.raises(ValueError, match=r"data.jsonl:2: difficulty"):
        lb.load(jl)
    with pytest.raises(FileNotFoundError, match="data.json"):
        lb.load(tmp_path / "missing.json")


def test_judge_and_aggregate_hand_computed():
    responses = [
        "The correct answer is (B)",
        "The correct answer is C",
        "I am not sure",
        "The correct answer is (A)",
    ]
    items = [
        _item(0, "B", "easy", "short"),
        _item(1, "C", "hard", "short"),
        _item(2, "D", "hard", "medium"),
        _item(3, "B", "hard", "long"),
    ]
    recs = [
        dict(lb.judge(r, it["answer"]), difficulty=it["difficulty"], length=it["length"])
        for r, it in zip(responses, items)
    ]
    assert [r["pred"] for r in recs] == ["B", "C", None, "A"]
    agg = lb.aggregate(recs)
    assert agg["overall"]["accuracy"] == 50.0 and agg["overall"]["n"] == 4
    assert agg["easy"]["accuracy"] == 100.0 and agg["hard"]["accuracy"] == pytest.approx(100 / 3)
    assert agg["short"]["accuracy"] == 100.0 and agg["medium"]["accuracy"] == 0.0
    assert agg["long"]["n"] == 1
    assert agg["overall"]["lo"] < 50 < agg["overall"]["hi"]
    assert lb.aggregate(recs, compensated=True)["overall"]["accuracy"] == pytest.approx(56.25)
