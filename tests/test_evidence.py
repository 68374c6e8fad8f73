"""Evidence recall (eval/evidence.py) and the methods' coverage (the keys each computed), on
synthetic inputs whose answer is known."""

import math

import pytest
import torch

from eval.evidence import EvidenceProbe, dense_probs, locate
from s2o.methods import bind

SEG, BLOCK = 32, 16
KNOBS = {
    "full": {},
    "s2o": dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.3, impl="reference"),
    "flexprefill": dict(block_size=BLOCK, min_budget=32, gamma=0.5, impl="reference"),
    "xattn": dict(block_size=BLOCK, stride=4, threshold=0.5, impl="reference"),
    "pbs": dict(block_size=BLOCK, segment_size=SEG, threshold=0.5, impl="reference"),
}


def _qkv(L=160, Hq=4, Hkv=2, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hq, L, D, generator=gen) * 1.5
    k = torch.randn(1, Hkv, L, D, generator=gen)
    v = torch.randn(1, Hkv, L, D, generator=gen)
    return q, k, v


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_coverage_reproduces_the_output(name):
    """Attention restricted to the keys ``coverage`` reports equals the method's own output for
    those rows: the coverage is the set of keys the method computed, no more, no less."""
    q, k, v = _qkv()
    bound = bind(name, **KNOBS[name])
    plan = bound.estimate(q, k, v)
    out, stats = bound.attend(q, k, v, plan)
    L = q.shape[2]
    rows = torch.tensor([0, 5, 40, 77, 100, 131, 150, L - 1])
    cov = bound.coverage(plan, stats, rows, L)
    assert cov.shape == (1, 4, len(rows), L) and cov.dtype == torch.bool
    assert not bool((cov & (torch.arange(L)[None, :] > rows[:, None])).any()), "future keys"
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = (q[:, :, rows].double() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    p = torch.softmax(s.masked_fill(~cov, float("-inf")), -1)
    want = p @ vv
    assert float((out[:, :, rows].double() - want).abs().max()) < 1e-4
    if name != "full":  # the test must be able to tell a sparse coverage from a dense one
        assert bool((~cov & (torch.arange(L)[None, :] <= rows[:, None])).any())


def _needle_case(L=192, D=16, pos=20, rows=(186, 187, 188, 189, 190, 191)):
    """Question rows that attend almost only to key ``pos`` (the needle), far in the prefix."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, L, D, generator=gen) * 0.3
    k = torch.randn(1, 1, L, D, generator=gen) * 0.3
    v = torch.randn(1, 1, L, D, generator=gen)
    direction = torch.randn(D, generator=gen)
    direction /= direction.norm()
    k[0, 0, pos] = 6 * direction
    for r in rows:
        q[0, :, r] = 6 * direction
    keys = torch.zeros(L, dtype=torch.bool)
    keys[pos] = True
    from eval.evidence import Evidence

    return q, k, v, Evidence(keys, torch.tensor(rows), [(pos, pos + 1)])


@pytest.mark.parametrize(
    "name,knobs,recall",
    [
        ("full", {}, 1.0),
        # local window and own segment only: the needle, in the ranked prefix, is never walked
        ("s2o", dict(KNOBS["s2o"], walk_budget=0), 0.0),
        # the question's tiles walk their whole prefix
        ("s2o", dict(KNOBS["s2o"], dense_tail=8), 1.0),
    ],
)
def test_probe_recall_on_a_known_needle(name, knobs, recall):
    q, k, v, ev = _needle_case()
    bound = bind(name, **knobs)
    plan = bound.estimate(q, k, v)
    _, stats = bound.attend(q, k, v, plan)
    probe = EvidenceProbe()
    probe.start(ev)
    probe(3, q, k, plan, stats, None, bound)
    out = probe.summary()
    assert out["layers"] == [3] and out["rows"] == 6 and out["evidence_tokens"] == 1
    assert min(out["mass"][0]) > 0.9  # the rows do read the needle
    assert out["evidence_recall"] == pytest.approx(recall, abs=1e-6)
    if name == "s2o":
        s2o = out["s2o"]
        assert set(s2o) == {"walk_share", "rank_segment_mean", "rank_question_mean"}
        assert s2o["rank_question_mean"][0] == [0.0, 0.0]  # the question ranks the needle first
        assert s2o["walk_share"][0] == ([0.0, 0.0] if recall == 0 else [1.0, 1.0])


def test_probe_is_silent_without_evidence_and_checks_length():
    q, k, v, ev = _needle_case()
    bound = bind("full")
    probe = EvidenceProbe()
    probe(0, q, k, None, bound.attend(q, k, v, None)[1], None, bound)
    assert probe.summary() is None
    short = type(ev)(ev.keys[:-1], ev.rows, ev.spans)
    probe.start(short)
    with pytest.raises(ValueError, match="located in 191 tokens, the prefill has 192"):
        probe(0, q, k, None, bound.attend(q, k, v, None)[1], None, bound)


def test_dense_probs_are_causal_softmax():
    q, k, _ = _qkv(L=40)
    rows = torch.tensor([3, 39])
    p = dense_probs(q, k, rows, 0.25)
    assert torch.allclose(p.sum(-1), torch.ones(1, 4, 2))
    assert float(p[0, :, 0, 4:].abs().max()) == 0.0


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


@pytest.mark.models
def test_locate_maps_strings_to_tokens():
    words = "hay more the number for red is 7 . what is it ? answer".split()
    tok = _word_tokenizer(words)
    prompt = "hay hay the number for red is 7 . more hay what is it ? answer"
    needle, question = "the number for red is 7 .", "what is it ?"
    ev = locate(tok, prompt, True, [needle], question)  # BOS first: token 0 is <s>
    assert ev.spans == [(3, 10)]
    assert ev.keys.nonzero().flatten().tolist() == list(range(3, 10))
    assert ev.rows.tolist() == [12, 13, 14, 15, 16]
    ev = locate(tok, prompt, False, [needle], question)
    assert ev.spans == [(2, 9)] and ev.rows.tolist()[0] == 11
    with pytest.raises(ValueError, match="not found"):
        locate(tok, prompt, True, ["blue"], question)
    with pytest.raises(ValueError, match="more than once"):
        locate(tok, prompt, True, ["hay"], question)
