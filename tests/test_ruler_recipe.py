"""RULER recipe variants (eval/tasks/ruler/recipe.py): the defaults leave the official samples
unchanged, each knob changes only its feature, variants name themselves in task and id, and
invalid or misplaced knobs are refused."""

from __future__ import annotations

import pytest

pytest.importorskip("wonderwords")
from eval.tasks.ruler import (  # noqa: E402
    PromptFormat,  # noqa: E402
    generate,
    load_samples,
    recipe,
)
from eval.tasks.ruler.templates import NOISE  # noqa: E402
from tests.test_ruler import CHAT, bpe_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def fmt():
    return PromptFormat(bpe_tokenizer(), render=CHAT.format, add_special_tokens=False)


@pytest.fixture(scope="module")
def essays(tmp_path_factory):
    folder = tmp_path_factory.mktemp("essays")
    sents = [f"Sentence {j} says that startups grow fast and founders learn." for j in range(90)]
    (folder / "e.txt").write_text(" ".join(sents) + "\n")
    return str(folder)


def _body(s: dict) -> str:
    return s["input"].split("afterwards.\n", 1)[1].rsplit("\nWhat is", 1)[0]


def test_official_recipe_leaves_samples_unchanged(fmt):
    plain = generate("niah_single_1", 1024, fmt, n=3, seed=7)
    official = generate("niah_single_1", 1024, fmt, n=3, seed=7,
                        data={"recipe": dict(recipe.OFFICIAL)})  # fmt: skip
    assert plain == official
    assert plain[0]["task"] == "niah_single_1" and plain[0]["id"].startswith("ruler/niah_single_1/")


def test_depth_moves_only_the_needle(fmt):
    base = generate("niah_single_1", 1024, fmt, n=3, seed=7)
    for depth in (0, 50, 100):
        var = generate("niah_single_1", 1024, fmt, n=3, seed=7, data={"recipe": {"depth": depth}})
        for b, v in zip(base, var):
            assert v["task"] == f"niah_single_1[depth={depth}]"
            assert v["id"] == f"ruler/niah_single_1[depth={depth}]/1024/7/{b['index']}"
            assert v["outputs"] == b["outputs"]  # the same keys and values as the official one
            lines = _body(v).split("\n")
            (line,) = v["needle_lines"]
            assert lines[line].startswith("One of the special magic number")
            assert abs(line - depth / 100 * (len(lines) - 1)) <= 1, (line, len(lines), depth)


def test_essay_depth(fmt, essays):
    for s in generate("niah_single_2", 1024, fmt, n=2, seed=3,
                      data={"essays_dir": essays, "recipe": {"depth": 90}}):  # fmt: skip
        assert s["needle_depths"] == [90]
        body = _body(s)
        before, total = (
            body[: body.index("One of the special")].count("Sentence "),
            body.count("Sentence "),
        )
        assert before == int(total * 90 / 100), (before, total)  # RULER's cut: int(len * depth)


def test_answer_prefix_off_ends_at_the_question(fmt):
    base = generate("niah_single_1", 1024, fmt, n=2, seed=7)
    var = generate("niah_single_1", 1024, fmt, n=2, seed=7,
                   data={"recipe": {"answer_prefix": False}})  # fmt: skip
    for b, v in zip(base, var):
        assert b["answer_prefix"] and v["answer_prefix"] == ""
        assert v["task"] == "niah_single_1[answer_prefix=false]"
        assert v["outputs"] == b["outputs"] and v["question"] == b["question"]


def test_line_break_off_joins_with_spaces(fmt):
    (s,) = generate("niah_single_1", 1024, fmt, n=1, seed=7, data={"recipe": {"line_break": False}})
    body = _body(s)
    assert "\n" not in body and body.count(NOISE) == s["haystack_size"]


def test_haystack_swap(fmt, essays):
    (s,) = generate("niah_single_1", 1024, fmt, n=1, seed=7,
                    data={"essays_dir": essays, "recipe": {"haystack": "essay"}})  # fmt: skip
    assert s["task"] == "niah_single_1[haystack=essay]"
    assert NOISE not in s["input"] and "startups grow fast" in s["input"]
    assert s["needle_depths"] and s.get("needle_lines") is None


def test_cache_keys_apart(fmt, tmp_path):
    a = load_samples("niah_single_1", 1024, fmt, 2, 7, {}, tmp_path)
    b = load_samples("niah_single_1", 1024, fmt, 2, 7, {"recipe": {"depth": 50}}, tmp_path)
    assert [s["id"] for s in a] != [s["id"] for s in b]
    assert load_samples("niah_single_1", 1024, fmt, 2, 7, {}, tmp_path) == a


@pytest.mark.parametrize(
    ("task", "variant", "match"),
    [
        ("niah_single_1", {"depth": 101}, "0..100"),
        ("niah_single_1", {"depth": True}, "0..100"),
        ("niah_single_1", {"haystack": "poems"}, "one of"),
        ("niah_single_1", {"depht": 5}, "unknown key"),
        ("niah_single_1", {"answer_prefix": "no"}, "true or false"),
        ("niah_single_2", {"line_break": False}, "no line"),
        ("vt", {"depth": 50}, "niah tasks only"),
    ],
)
def test_invalid_recipes_refused(fmt, tmp_path, task, variant, match):
    with pytest.raises(ValueError, match=match):
        load_samples(task, 1024, fmt, 1, 7, {"recipe": variant}, tmp_path)


def test_label_round_trip():
    name = recipe.label("niah_single_1", {"depth": 50, "answer_prefix": False})
    assert name == "niah_single_1[answer_prefix=false,depth=50]"
    assert recipe.split(name) == ("niah_single_1", "answer_prefix=false,depth=50")
    assert recipe.split("niah_single_1") == ("niah_single_1", None)
