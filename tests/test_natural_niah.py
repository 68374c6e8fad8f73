"""natural_niah's construction (eval/tasks/natural_niah/): lengths in their band by the tokenizer,
every needle once, the asked keys unique, no answer in the question, determinism by seed, the
knobs, evidence spans, the haystack's source in the cache key, refusals, and the config."""

from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("wonderwords")
from eval.metrics import ruler_score  # noqa: E402
from eval.tasks import natural_niah as nn  # noqa: E402
from eval.tasks.base import TaskConfigError, get  # noqa: E402
from eval.tasks.natural_niah import build, haystacks  # noqa: E402
from eval.tasks.ruler import PromptFormat  # noqa: E402

CHAT = "<|user|>\n{}<|end|>\n<|assistant|>\n"
NEEDLE = re.compile(r"One of the special magic numbers for (\S+) is: (\d+)\.")
SHORT = (
    4096  # the tests' byte-level BPE spends ~1.5 characters a token: 4K is ~15 code files' lines
)


@pytest.fixture(scope="module")
def fmt():
    from test_ruler import bpe_tokenizer

    return PromptFormat(bpe_tokenizer(), render=CHAT.format, add_special_tokens=False)


@pytest.fixture(scope="module")
def made(fmt):
    """A sample of every task at SHORT tokens (one generation per test module)."""
    return {task: nn.generate(task, SHORT, fmt, n=1, seed=3) for task in nn.TASKS}


def _context(s: dict) -> str:
    return s["input"].split(s["question"])[0]


@pytest.mark.parametrize("kind", haystacks.KINDS)
def test_length_in_its_band_by_the_tokenizer(kind, fmt):
    """Prompt (chat template, answer prefix) + tokens to generate: within 2% under the length."""
    for s in nn.generate(f"{kind}_multikey", 16384, fmt, n=1, seed=1):
        n_tok = len(fmt.tokenizer.encode(s["input"] + s["answer_prefix"], add_special_tokens=False))
        assert n_tok == s["prompt_tokens"]
        total = n_tok + build.TOKENS_TO_GENERATE
        assert (1 - build.SLACK) * 16384 <= total <= 16384, (kind, total)
        assert s["input"].startswith("<|user|>\n") and s["input"].endswith("<|assistant|>\n")


@pytest.mark.parametrize("task", sorted(nn.TASKS))
def test_every_needle_once_and_the_asked_keys_unique(task, made):
    n_asked, per_key = build.FORMS[nn.TASKS[task][1]]
    for s in made[task]:
        prompt, context = s["input"] + s["answer_prefix"], _context(s)
        found = NEEDLE.findall(context)
        assert len(found) == s["needles"] == (n_asked + s["distractors"]) * per_key
        keys = {k for k, _ in found}
        assert len(keys) == n_asked + s["distractors"]
        for _key, value in found:  # each value once in the whole prompt, in its needle
            assert prompt.count(value) == 1 and sum(v == value for _, v in found) == 1
        asked = [k for k, v in found if v in s["outputs"]]
        assert len(asked) == len(s["outputs"]) == n_asked * per_key
        for key in set(asked):  # in its own needles only; no other key contains it
            assert context.lower().count(key.lower()) == per_key, key
            assert not any(key in other for other in keys - {key})
            assert key in s["question"] and key in s["answer_prefix"]


@pytest.mark.parametrize("task", sorted(nn.TASKS))
def test_the_answer_is_not_in_the_question(task, made):
    for s in made[task]:
        asked_part = s["question"] + s["answer_prefix"]
        without_needles = NEEDLE.sub("", s["input"] + s["answer_prefix"])
        for value in s["outputs"]:
            assert value not in asked_part and value not in without_needles


@pytest.mark.parametrize("kind", haystacks.KINDS)
def test_needles_in_the_haystacks_form(kind, made):
    s = made[f"{kind}_multivalue"][0]
    lines = _context(s).split("\n")
    at = [i for i, line in enumerate(lines) if NEEDLE.search(line)]
    for i in at:
        line = lines[i]
        if kind == "code":  # a comment after a blank line (or after a needle at the same place)
            assert line.lstrip().startswith("# One of")
            first = lines[i - 1].startswith("Some special magic")  # the window's first place
            last = all(NEEDLE.search(x) or not x.strip() for x in lines[i + 1 :])  # its last
            assert first or last or not lines[i - 1].strip() or NEEDLE.search(lines[i - 1])
        elif kind == "prose":  # a paragraph of its own
            assert line.startswith("One of") and not lines[i + 1].strip()
        else:  # a JSON record of its own
            assert line.startswith('{"note": "One of') and line.endswith('."}')
    assert s["haystack"] == haystacks.identity(kind)


def test_seeded_deterministic_and_n_independent(fmt):
    a = nn.generate("code_multiquery", SHORT, fmt, n=2, seed=9)
    assert a == nn.generate("code_multiquery", SHORT, fmt, n=2, seed=9)
    assert nn.generate("code_multiquery", SHORT, fmt, n=1, seed=9) == a[:1]
    other = nn.generate("code_multiquery", SHORT, fmt, n=1, seed=10)[0]
    assert other["outputs"] != a[0]["outputs"] and other["input"] != a[0]["input"]
    assert len({s["id"] for s in a}) == 2


def test_depth_knob_places_the_asked_needles_and_keeps_the_keys(fmt):
    base = nn.generate("records_multivalue", SHORT, fmt, n=1, seed=4)[0]
    at50 = nn.generate("records_multivalue", SHORT, fmt, n=1, seed=4, data={"depth": 50})[0]
    assert at50["task"] == "records_multivalue[depth=50]" and base["task"] == "records_multivalue"
    assert at50["outputs"] == base["outputs"] and at50["id"] != base["id"]
    step = 100 / at50["haystack_lines"]  # a record line is a place
    assert all(abs(d - 50) <= step for d in at50["depth"]), at50["depth"]
    few = nn.generate("records_multivalue", SHORT, fmt, n=1, seed=4, data={"distractors": 2})[0]
    assert few["task"] == "records_multivalue[distractors=2]" and few["needles"] == 3 * 4


def test_evidence_and_question_locate_in_tokens(fmt, made):
    from eval.evidence import locate

    for kind in haystacks.KINDS:
        s = made[f"{kind}_multiquery"][0]
        prompt = s["input"] + s["answer_prefix"]
        ev = locate(fmt.tokenizer, prompt, fmt.add_special_tokens, s["evidence"], s["question"])
        ids = fmt.encode(prompt)
        assert ev.keys.numel() == len(ids) == s["prompt_tokens"]
        assert len(ev.spans) == len(s["outputs"])
        for (a, b), value in zip(ev.spans, [NEEDLE.search(e)[2] for e in s["evidence"]]):
            assert value in fmt.tokenizer.decode(ids[a:b]) and value in s["outputs"]
        assert int(ev.rows[0]) > max(b for _, b in ev.spans)


def test_exact_match_scoring(made):
    task = get("natural_niah")
    s = made["prose_multivalue"][0]
    sample = {"gold": s["outputs"], "metric": s["metric"], "depth": s["depth"],
              "distractors": s["distractors"], "haystack": s["haystack"]}  # fmt: skip
    assert task.score(sample, " " + ", ".join(s["outputs"]) + ".")[0] == 1.0
    assert task.score(sample, " " + ", ".join(s["outputs"][:2]))[0] == 0.5
    distractor = next(v for _, v in NEEDLE.findall(s["input"]) if v not in s["outputs"])
    value, extra = task.score(sample, distractor)
    assert value == 0.0 and extra["haystack"] == s["haystack"] and extra["depth"] == s["depth"]
    assert ruler_score(s["metric"], "", s["outputs"]) == 0.0


def test_fit_lines_secant_band_and_refusals():
    calls = []

    def count(n):  # ~13 tokens a line, uneven, plus a 300-token prompt
        calls.append(n)
        return 300 + 13 * n + (7 * n) % 11

    length = 100_000
    n, t = build.fit_lines(count, length - build.TOKENS_TO_GENERATE, 50_000, "t")
    assert t == count(n) and (1 - build.SLACK) * length <= t + build.TOKENS_TO_GENERATE <= length
    assert len(calls) < 12  # a secant: a few tokenizations, not a binary search's 17
    with pytest.raises(ValueError, match="short of"):
        build.fit_lines(count, 100_000, 1000, "t")
    with pytest.raises(ValueError, match="without haystack"):
        build.fit_lines(count, 200, 1000, "t")


def test_cache_keyed_by_the_haystack_source(fmt, tmp_path, monkeypatch):
    first = nn.load_samples("code_multikey", SHORT, fmt, n=1, seed=1, cache_dir=tmp_path)
    keys = list((tmp_path / "natural_niah" / "code_multikey").glob("*.key.json"))
    assert len(keys) == 1 and '"CPython ' in keys[0].read_text()
    assert "sha256" in keys[0].read_text() and "wonderwords" in keys[0].read_text()
    monkeypatch.setattr(nn, "generate", lambda *a, **k: pytest.fail("regenerated"))
    assert nn.load_samples("code_multikey", SHORT, fmt, n=1, seed=1, cache_dir=tmp_path) == first
    other = dict(haystacks.identity("code"), sha256="another build")
    monkeypatch.setattr(haystacks, "identity", lambda kind: other)
    with pytest.raises(pytest.fail.Exception, match="regenerated"):
        nn.load_samples("code_multikey", SHORT, fmt, n=1, seed=1, cache_dir=tmp_path)


def test_missing_sources_are_refused_naming_them(tmp_path, monkeypatch):
    task = get("natural_niah")
    bench = {"tasks": ["code_multikey"], "n": 1, "data": {}}
    monkeypatch.setattr(haystacks, "stdlib_dir", lambda: tmp_path)
    with pytest.raises(TaskConfigError, match=r"the code haystack: .*\.py sources"):
        task.check(bench)
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)
    with pytest.raises(TaskConfigError, match=r"the prose haystack: .*pydoc_data"):
        task.check(dict(bench, tasks=["prose_multikey"]))
    task.check(bench)  # the code haystack does not need pydoc_data


@pytest.mark.parametrize(
    "bench, needle",
    [
        ({"tasks": ["code_multikey", "code_single"]}, r"unknown natural_niah task\(s\)"),
        ({"n": None}, r"give benchmark.n=<int>"),
        ({"data": {"depth": 101}}, r"depth=101: an int percent"),
        ({"data": {"distractors": -1}}, r"distractors=-1: an int >= 0"),
        ({"data": {"haystack": "noise"}}, r"unknown key\(s\) \['haystack'\]"),
    ],
)  # fmt: skip
def test_bad_benchmark_values_are_refused(bench, needle):
    with pytest.raises(TaskConfigError, match=needle):
        get("natural_niah").check({"tasks": ["code_multikey"], "n": 1, "data": {}, **bench})


def test_config_composes_checks_and_builds(fmt, tmp_path):
    """`python run.py kind=accuracy benchmark=natural_niah ...` composes, passes the job's checks
    before any model loads, and builds its samples (the tests' tokenizer for the model's)."""
    from harness_util import compose
    from omegaconf import OmegaConf

    import run
    from experiments import accuracy
    from experiments.common import resolved_config

    args = ["kind=accuracy", "benchmark=natural_niah", "model=smollm2_135m", "method=full",
            "benchmark.tasks=[code_multikey,records_multiquery]", f"benchmark.lengths=[{SHORT}]",
            "benchmark.n=1", "benchmark.data.depth=25",
            f"benchmark.cache_dir={tmp_path}"]  # fmt: skip
    cfg = compose(args)
    resolved = resolved_config(run.prepare(cfg), run.job_context(cfg))
    accuracy.check_job(resolved)
    samples = accuracy.build_samples(resolved["benchmark"], fmt)
    want = ["code_multikey[depth=25]", "records_multiquery[depth=25]"]
    assert [s["task"] for s in samples] == want
    for s in samples:
        ask = s["question"] + "<|end|>\n<|assistant|>\n" + s["prompt"].split("<|assistant|>\n")[1]
        assert s["prompt"].endswith(ask) and s["max_new_tokens"] == build.TOKENS_TO_GENERATE
        assert s["evidence"] and s["haystack"]["kind"] in s["task"] and s["depth"]
    full = OmegaConf.to_container(compose(["kind=accuracy", "benchmark=natural_niah"]).benchmark)
    assert sorted(full["tasks"]) == sorted(nn.TASKS) and full["lengths"] == [16384, 32768]


@pytest.mark.parametrize("kind", haystacks.KINDS)
def test_each_haystack_holds_a_128k_prompt(kind):
    """A window never repeats a line: each haystack must hold 128K tokens of a real tokenizer
    (English BPEs spend about 4 characters a token; 4.5 here to be safe)."""
    hay = haystacks.load(kind)
    assert len(hay.lowered) >= 4.5 * 131072, (kind, len(hay.lowered))
    assert hay.starts and all(hay.lines[i].strip() for i in hay.starts[:100])


def test_a_job_writes_knobs_source_and_evidence_recall_on_its_lines(tmp_path):
    """kind=accuracy end to end on a tiny random model: each line carries its sample's depth,
    distractors and haystack source, and dense attention's evidence recall is 1."""
    import json

    import torch
    from test_accuracy import _resolved
    from test_ruler import bpe_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    from experiments import accuracy

    tok = bpe_tokenizer()
    cfg = AutoConfig.for_model(
        "llama", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    res = _resolved(tmp_path, "full", 1)
    res["benchmark"].update(name="natural_niah", tasks=["records_multikey"], lengths=[1024],
                            evidence=True, data={"distractors": 2, "depth": 40})  # fmt: skip
    m = accuracy.evaluate(res, tmp_path / "s.jsonl", model, tok)
    (line,) = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert line["task"] == "records_multikey[depth=40,distractors=2]" and m["n_samples"] == 1
    assert line["distractors"] == 2 and line["haystack"] == haystacks.identity("records")
    assert len(line["depth"]) == 1 and abs(line["depth"][0] - 40) < 20
    assert line["evidence"]["evidence_recall"] == pytest.approx(1.0)
