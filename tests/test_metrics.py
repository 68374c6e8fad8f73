"""Every official metric against hand-computed values on constructed predictions, against
lm-evaluation-harness where it implements the same definition, and the uncertainty helpers."""

from __future__ import annotations

import math

import pytest

from eval import metrics as m
from eval import significance as sig

# ---------------------------------------------------------------- RULER


def test_string_match_all_and_part():
    refs = ["1234567", "7654321", "Apple-Pie", "x"]
    pred = "The numbers are 1234567 and apple-pie."
    assert m.string_match_all(pred, refs) == 0.5  # 2 of 4, case-insensitive
    assert m.string_match_part(pred, refs) == 1.0
    assert m.string_match_part("nothing", refs) == 0.0
    assert m.string_match_all("", ["a"]) == 0.0


def test_ruler_postprocess_and_score():
    assert m.ruler_postprocess("  a\tb\x01c \n") == "a\nb\nc"
    assert m.ruler_score("string_match_all", " 123\x00456 ", ["123", "456"]) == 1.0
    assert m.ruler_score("string_match_part", "Paris", ["paris", "Lyon"]) == 1.0


def test_ruler_matches_lm_eval():
    cu = pytest.importorskip("lm_eval.tasks.ruler.common_utils")
    cases = [("the answer is 12 and 34", ["12", "34", "56"]), ("NONE", ["a"]), ("AbC", ["abc"])]
    for pred, refs in cases:
        assert m.string_match_all(pred, refs) == pytest.approx(cu.string_match_all([pred], [refs]))
    # lm-eval's string_match_part averages over the golds; RULER's takes the best: equal for 1 gold
    assert m.string_match_part("x 12", ["12"]) == cu.string_match_part(["x 12"], [["12"]])
    assert m.string_match_part("x 12", ["12", "34"]) == 1.0
    assert cu.string_match_part(["x 12"], [["12", "34"]]) == 0.5


# ---------------------------------------------------------------- InfiniteBench


def test_passkey_and_number():
    assert m.first_int("The pass key is 71432.") == "71432"
    assert m.passkey_match("The pass key is 71432. Remember", ["71432"]) == 1.0
    assert m.passkey_match("71432 or 12345", "12345") == 0.0  # only the first digit run counts
    assert m.number_string_match("sequence: 0012334455", ["0012334455"]) == 1.0
    assert m.passkey_match("no digits", ["1"]) == 0.0


def test_kv_dialogue_code_run_math_find():
    assert m.kv_retrieval_match('The value is "a1b2-c3".', ["a1b2-c3"]) == 1.0
    assert m.kv_retrieval_match("a1b2-c3x", ["a1b2-c3"]) == 0.0
    assert m.dialogue_match("It is probably Hamlet.", ["HAMLET"]) == 1.0
    assert m.dialogue_match("Hamletto", ["HAMLET"]) == 0.0
    assert m.code_run_match("The value of func_1(3) is 42.", [42]) == 1.0
    assert m.code_run_match("42 is not last: foo", [42]) == 0.0
    assert m.code_run_match("", [42]) == 0.0
    assert m.math_find_match("The answer is 17, not 18", [17]) == 1.0
    assert m.math_find_match("3.5", [3.5]) == 1.0
    assert m.math_find_match("none", [3]) == 0.0
    assert m.math_find_match("0.3 or 3", [3]) == 0.0


def test_choice_match():
    label = ["the red fox", "C"]
    assert m.choice_match("C. the red fox", label) == 1.0
    assert m.choice_match("B", label) == 0.0
    assert m.choice_match("the red fox", label) == 1.0
    assert m.choice_match("I think the answer is: C", label) == 1.0
    assert m.choice_match("I think the answer is: B", label) == 0.0
    assert m.choice_match("so option is C", label) == 1.0
    assert m.choice_match("I guess C", label) == 1.0  # first standalone letter
    assert m.choice_match("", label) == 0.0


def test_code_debug_match():
    label = ["parse_header", "B"]
    assert m.code_debug_match("B. parse_header", label) == 1.0
    assert m.code_debug_match("B: yes", label) == 1.0
    assert m.code_debug_match("The correct option is: B", label) == 1.0
    assert m.code_debug_match("the answer is: parse_header", label) == 1.0
    assert m.code_debug_match("The correct option is: A", label) == 0.0
    assert m.code_debug_match("Option B", label) == 0.0  # no recognised prefix


def test_math_calc():
    assert m.math_calc_score("[1, 4, 8, 9]", [1, 4, 8, 10]) == 0.75
    assert m.math_calc_score("[5, 1, 4]", [[1, 4, 8, 10]], gpt4=True) == 0.5


def test_qa_f1_hand_computed():
    # pred tokens [eiffel, tower, paris] vs gold [eiffel, tower]: P = 2/3, R = 1, F1 = 0.8
    assert m.qa_f1("The Eiffel Tower, Paris!", ["Eiffel tower"]) == pytest.approx(0.8)
    assert m.qa_f1("London", ["Paris", "london"]) == 1.0  # best over golds
    assert m.qa_f1("", ["x"]) == 0.0
    assert m.normalize_answer("An apple, the Pear.") == "apple pear"


def test_qa_f1_zh_char_level():
    # pred chars 北京市 vs gold 北京: common 2, P = 2/3, R = 1, F1 = 0.8
    assert m.qa_f1_zh("北京市。", ["北京"]) == pytest.approx(0.8)
    assert m.normalize_zh_answer("「北京」， Yes!") == "北京yes"
    assert m.normalize_zh_answer("《书》") == "《书"  # the official list has 》 but not 《


def test_qa_f1_zh_jieba():
    pytest.importorskip("jieba")
    assert m.qa_f1_zh_jieba("北京", ["北京"]) == 1.0
    assert m.qa_f1_zh_jieba("上海", ["北京"]) == 0.0


def test_infinitebench_matches_lm_eval():
    u = pytest.importorskip("lm_eval.tasks.infinitebench.utils")
    for pred, label in [("The pass key is 71432.", "71432"), ("x 1 2", "2"), ("none", "5")]:
        assert (
            m.passkey_match(pred, [label])
            == u.process_results_int_match({"answer": [label]}, [pred])["score"]
        )
    for pred, label in [('value: "abc-1".', "abc-1"), ("abc-12", "abc-1")]:
        assert (
            m.kv_retrieval_match(pred, [label])
            == u.process_results_kv({"answer": [label]}, [pred])["score"]
        )
    for pred, gold in [
        ("The Eiffel Tower, Paris!", "Eiffel tower"),
        ("a b c d", "b d e"),
        ("x", "y"),
    ]:
        assert m.qa_f1(pred, [gold]) == pytest.approx(u._token_f1(pred, gold))
    for pred, gold in [("北京市。", "北京"), ("上海", "北京")]:
        assert m.qa_f1_zh(pred, [gold]) == pytest.approx(u._token_f1(pred, gold, is_chinese=True))


def test_rouge_lsum_hand_computed():
    pytest.importorskip("rouge_score")
    # LCS of "the cat sat" in "the cat sat on the mat" = 3: P = 1, R = 1/2, F = 2/3
    assert m.rouge_lsum("the cat sat", ["the cat sat on the mat"]) == pytest.approx(2 / 3)
    # summary-level LCS over newline-split sentences: both sentences matched in full
    assert m.rouge_lsum("a b\nc d", ["c d\na b"]) == pytest.approx(1.0)
    assert m.rouge_lsum("zzz", ["a b", "zzz q"]) == pytest.approx(2 / 3)  # best reference


# ---------------------------------------------------------------- LongBench v2


def test_extract_choice():
    assert m.extract_choice("The correct answer is (B).") == "B"
    assert m.extract_choice("**The correct answer is C**") == "C"
    assert m.extract_choice("the correct answer is (B)") is None  # case-sensitive, as official
    assert m.extract_choice("The correct answer is (E)") is None
    assert m.longbench_v2_judge("The correct answer is (A)", "A") == 1.0


# ---------------------------------------------------------------- uncertainty


def test_wilson_interval_known_values():
    lo, hi = sig.wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.4901625, 0.9433178), abs=1e-6)
    assert sig.wilson_interval(0, 20)[0] == 0.0 and sig.wilson_interval(20, 20)[1] == 1.0
    for n in (3, 10, 25, 50):  # exact bounds where center - half rounds to ~1e-17 (n=10 did)
        assert sig.wilson_interval(0, n)[0] == 0.0 and sig.wilson_interval(n, n)[1] == 1.0
    # hand formula at p = 1/2, n = 4: center 1/2, half = z/(1+z^2/4) * sqrt(1/16 + z^2/64)
    z = 1.959963984540054
    half = z / (1 + z * z / 4) * math.sqrt(1 / 16 + z * z / 64)
    assert sig.wilson_interval(2, 4) == pytest.approx((0.5 - half, 0.5 + half))


def test_wilson_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    ci = stats.binomtest(13, 40).proportion_ci(0.95, method="wilson")
    assert sig.wilson_interval(13, 40) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_bootstrap_interval():
    scores = [0.2, 0.4, 0.6, 0.8] * 10
    lo, hi = sig.bootstrap_interval(scores, seed=1)
    assert lo < 0.5 < hi and hi - lo < 0.2
    assert sig.bootstrap_interval([0.3] * 5) == (0.3, 0.3)
    out = sig.score_interval(scores)
    assert out["interval"] == "bootstrap" and out["mean"] == pytest.approx(0.5)
    assert sig.score_interval([1, 0, 1, 1])["interval"] == "wilson"


def test_mcnemar_exact_hand_computed():
    a = [1] * 5 + [1, 0, 0]
    b = [0] * 5 + [1, 0, 0]
    r = sig.mcnemar_exact(a, b)
    assert (r["n10"], r["n01"]) == (5, 0)
    assert r["p_value"] == pytest.approx(2 / 32)  # 2 * P(X <= 0 | Bin(5, 1/2))
    r = sig.mcnemar_exact([1, 0, 1, 0], [0, 1, 1, 0])
    assert r["p_value"] == 1.0 and r["diff"] == 0.0
    # n10 = 1, n01 = 6: p = 2 * (1 + 7) / 128
    r = sig.mcnemar_exact([1] + [0] * 6, [0] + [1] * 6)
    assert r["p_value"] == pytest.approx(16 / 128)
    with pytest.raises(ValueError, match="0/1"):
        sig.mcnemar_exact([0.5], [1])
    with pytest.raises(ValueError, match="same non-zero length"):
        sig.mcnemar_exact([1], [1, 0])


def test_paired_bootstrap_and_dispatch():
    a = [0.9, 0.8, 0.85, 0.95, 0.9] * 6
    b = [x - 0.1 for x in a]
    r = sig.paired_bootstrap(a, b)
    assert r["diff"] == pytest.approx(0.1) and r["lo"] == pytest.approx(0.1)
    assert "p_value" not in r  # interval only: its p was too small at these n
    same = sig.paired_bootstrap(a, a)
    assert same["lo"] == same["hi"] == 0.0
    assert sig.compare_paired([1, 0], [0, 0])["test"] == "mcnemar_exact"
    assert sig.compare_paired([0.5, 0], [0, 0])["test"] == "sign_flip_exact"
