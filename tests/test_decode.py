"""experiments.decode.greedy_decode against model.generate on tiny random models (CPU, fp32)."""

from __future__ import annotations

import itertools

import pytest
import torch

transformers = pytest.importorskip("transformers")

from experiments.decode import greedy_decode  # noqa: E402
from s2o.hf import sparse_prefill  # noqa: E402

pytestmark = pytest.mark.models  # re-run on the oldest accepted transformers (.ci/run)

VOCAB = 128
N = 12  # max_new_tokens
LENGTHS = (5, 11, 23, 40)  # 23 and 40 pass Gemma 3's sliding window (16) already in the prefill
# The test tokenizer: stop strings use the characters of STOP_CHARS, prompts only PROMPT_CHARS,
# so no stop string can run across the prompt's end (generate's StopStringCriteria would match
# there, this loop looks at the new tokens only: see experiments/decode.py).
STOP_CHARS, PROMPT_CHARS = "ab\n.", "cdefxyz"
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
TOKENS = (
    SPECIALS
    + ["".join(p) for n in (1, 2, 3) for p in itertools.product(STOP_CHARS, repeat=n)]
    + list(PROMPT_CHARS)
    + ["".join(p) for p in itertools.product(PROMPT_CHARS, repeat=2)]
)[:VOCAB]


def _tiny(arch: str):
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )  # fmt: skip

    # initializer_range 0.2 and untied embeddings: a random model whose greedy output varies
    # (the default init repeats one token, which would make EOS and stop strings trivial)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  initializer_range=0.2, tie_word_embeddings=False)  # fmt: skip
    if arch == "llama":
        cls = LlamaForCausalLM
        cfg = LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    elif arch == "qwen2":
        cls = Qwen2ForCausalLM
        cfg = Qwen2Config(**common, num_attention_heads=4, num_key_value_heads=2)
    else:  # Gemma 3: sliding-window layers 0 and 2 (window 16), its own query scale
        common["num_hidden_layers"] = 4
        cls, cfg = Gemma3ForCausalLM, Gemma3TextConfig(
            **common, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            sliding_window=16, query_pre_attn_scalar=32,
            layer_types=["sliding_attention", "full_attention"] * 2,
        )  # fmt: skip
    torch.manual_seed(0)
    model = cls(cfg).eval()
    model.generation_config.eos_token_id = None  # each test sets its own
    return model


def _tokenizer():
    """A word-level tokenizer over TOKENS (one- to three-character tokens), built offline: text
    encodes character by character, ids decode by concatenation."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TOKENS)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip


PROMPT_IDS = [i for i, t in enumerate(TOKENS) if t not in SPECIALS and set(t) <= set(PROMPT_CHARS)]


def _prompt(length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(length)
    pick = torch.randint(0, len(PROMPT_IDS), (1, length), generator=g)
    return torch.tensor(PROMPT_IDS)[pick]


def _generate(model, ids, max_new_tokens=N, **kw) -> list[int]:
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
        max_new_tokens=max_new_tokens, pad_token_id=0, **kw,
    )  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_token_ids_equal_generate_with_eos_and_max_new_tokens(arch):
    model = _tiny(arch)
    prompts = [_prompt(n) for n in LENGTHS]
    free = [_generate(model, ids) for ids in prompts]  # no EOS: every run is N tokens
    assert all(len(f) == N for f in free)
    # EOS: the token one prompt's run emits at step 3, chosen so that another prompt's run never
    # emits it (that one must run to max_new_tokens)
    src = next((i for i, f in enumerate(free) if any(f[3] not in g for g in free)), None)
    assert src is not None, f"every run emits every step-3 token: {free}"
    eos = free[src][3]
    # an int for one model, a list (with an id no run emits) for the others
    unused = next(i for i in range(VOCAB) if all(i not in f for f in free))
    model.generation_config.eos_token_id = eos if arch == "llama" else [unused, eos]
    stopped = set()
    for i, ids in enumerate(prompts):
        ref = _generate(model, ids)
        with torch.inference_mode():
            got = greedy_decode(model, ids, N)
        assert got.tokens.dtype == torch.long and got.tokens.device.type == "cpu"
        assert got.tokens.dim() == 1
        assert got.tokens.tolist() == ref, f"prompt of {ids.shape[1]} tokens"
        assert got.decode_steps == len(ref) - 1
        assert got.stopped == ("eos" if ref[-1] == eos else "max_new_tokens")
        assert got.prefill_ms > 0 and got.decode_ms >= 0
        stopped.add(got.stopped)
        if i == src:
            assert got.stopped == "eos" and len(ref) <= 4  # at step 3 at the latest
    assert stopped == {"eos", "max_new_tokens"}


def _cut(tok, new: list[int], stop: list[str]) -> str:
    text = tok.decode(new, skip_special_tokens=True)
    for s in stop:  # as experiments/accuracy.py: the answer ends before a stop string
        text = text.split(s, 1)[0]
    return text


def _stop_candidates(tok, new: list[int]) -> list[list[str]]:
    """Stop strings taken from a run's own tokens: one across a token boundary, one first seen
    inside a token (not at its start), a one-character one, two at once, one that never occurs."""
    pieces = [tok.decode([t], skip_special_tokens=True) for t in new]
    out = [["\n"], ["a", "."], ["ab\n.ab\n."]]  # the last: (most likely) never
    for prev, cur in zip(pieces, pieces[1:]):
        if prev and cur and prev[-1] in STOP_CHARS and cur[0] in STOP_CHARS:
            out.append([prev[-1] + cur[0]])
            break
    seen = ""
    for p in pieces:  # a character first seen inside a token, not at its start
        inside = [c for c in p[1:] if c in STOP_CHARS and c != p[0] and c not in seen]
        if inside:
            out.append([inside[0]])
            break
        seen += p
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_stop_strings_stop_where_generate_does_and_cut_the_same_text(arch):
    model, tok = _tiny(arch), _tokenizer()
    model.generation_config.eos_token_id = tok.eos_token_id
    stopped_by_string = 0
    for length in LENGTHS:
        ids = _prompt(length)
        for stop in _stop_candidates(tok, _generate(model, ids, 24)):
            ref = _generate(model, ids, 24, stop_strings=stop, tokenizer=tok)
            got = greedy_decode(model, ids, 24, tokenizer=tok, stop=stop)
            assert _cut(tok, got.tokens.tolist(), stop) == _cut(tok, ref, stop), (length, stop)
            assert got.tokens.tolist() == ref, (length, stop)  # it stops where generate does
            text = tok.decode(got.tokens.tolist(), skip_special_tokens=True)
            assert (got.stopped == "stop_string") == any(s in text for s in stop)
            stopped_by_string += got.stopped == "stop_string"
    assert stopped_by_string >= 4, "the stop strings never ended decoding: the test tests nothing"


def test_long_outputs_check_a_tail_window_and_still_stop(monkeypatch):
    """Past the window only the last tokens are decoded: a stop string there still stops."""
    from experiments import decode

    model, tok = _tiny("llama"), _tokenizer()
    ids = _prompt(11)
    free = _generate(model, ids, 40)
    pieces = [tok.decode([t], skip_special_tokens=True) for t in free]
    monkeypatch.setattr(decode, "TAIL", 2)  # window: 2 + 4 * len(stop) = 10 tokens
    # a stop string across two tokens past the window, which no earlier token pair holds
    at = next(
        i for i in range(12, len(free)) if pieces[i - 1] and pieces[i]
        and (pieces[i - 1][-1] + pieces[i][0]) not in "".join(pieces[:i])
        and set(pieces[i - 1][-1] + pieces[i][0]) <= set(STOP_CHARS)
    )  # fmt: skip
    stop = pieces[at - 1][-1] + pieces[at][0]
    calls = []
    real_decode = tok.decode
    monkeypatch.setattr(tok, "decode", lambda t, **k: calls.append(len(t)) or real_decode(t, **k))
    got = greedy_decode(model, ids, 40, tokenizer=tok, stop=[stop])
    ours = list(calls)
    ref = _generate(model, ids, 40, stop_strings=[stop], tokenizer=tok)
    assert got.stopped == "stop_string"
    assert _cut(tok, got.tokens.tolist(), [stop]) == _cut(tok, ref, [stop])
    window = 2 + 4 * len(stop)
    assert len(got.tokens) == at + 1 and got.tokens.tolist() == free[: at + 1]
    assert max(ours[:-1]) == window and ours[-1] == at + 1  # the last: the confirmation


def test_prefill_is_one_forward_inside_sparse_prefill():
    model = _tiny("llama")
    model.generation_config.eos_token_id = None
    ids = _prompt(192)
    knobs = dict(segment_len=64, tau=0.3, block_m=16, block_n=16, impl="reference")
    with sparse_prefill(model, "s2o", **knobs) as run:
        got = greedy_decode(model, ids, 6)
        assert len(run.prefills) == 1 and run.stats.length == 192
        assert run.decode_calls == got.decode_steps * 2 == 5 * 2  # 5 decode forwards x 2 layers
        assert 0 < run.stats.density < 1 and run.stats.total_ms > 0
        run.reset()
        ref = _generate(model, ids, 6)  # generate through the same plug-in: the same tokens
        assert len(run.prefills) == 1
    assert got.tokens.tolist() == ref


def test_logits_to_keep_and_one_token_per_decode_forward():
    model = _tiny("qwen2")
    ids = _prompt(40)
    seen = []

    def pre(module, args, kwargs):
        seen.append({"q": kwargs["input_ids"].shape, "keep": kwargs.get("logits_to_keep")})

    def post(module, args, kwargs, out):
        seen[-1]["logits"] = tuple(out.logits.shape)

    h1 = model.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = model.register_forward_hook(post, with_kwargs=True)
    try:
        got = greedy_decode(model, ids, 5)
    finally:
        h1.remove()
        h2.remove()
    assert len(seen) == 1 + got.decode_steps == 5
    assert seen[0]["q"] == (1, 40) and all(s["q"] == (1, 1) for s in seen[1:])
    assert all(s["keep"] == 1 and s["logits"] == (1, 1, VOCAB) for s in seen)


def test_eos_from_the_tokenizer_and_refusals():
    from types import SimpleNamespace

    model = _tiny("llama")
    ids = _prompt(11)
    first = greedy_decode(model, ids, 6).tokens.tolist()  # no EOS anywhere: 6 tokens
    assert len(first) == 6
    # no EOS in the generation config: the tokenizer's ends decoding
    got = greedy_decode(model, ids, 6, tokenizer=SimpleNamespace(eos_token_id=first[2]))
    assert got.tokens.tolist() == first[: first.index(first[2]) + 1] and got.stopped == "eos"
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(model, ids, 0)
    with pytest.raises(ValueError, match=r"\[1, L\]"):
        greedy_decode(model, torch.cat([ids, ids]), 4)
    with pytest.raises(ValueError, match="tokenizer"):
        greedy_decode(model, ids, 4, stop=["\n"])
    model.generation_config.repetition_penalty = 1.3  # generate would apply it even greedy
    with pytest.raises(ValueError, match="repetition_penalty"):
        greedy_decode(model, ids, 4)
    model.generation_config.repetition_penalty = 1.0  # neutral: decodes
    assert greedy_decode(model, ids, 6).tokens.tolist() == first


def test_generate_one_keeps_its_record_and_adds_loop_fields():
    from experiments import accuracy

    model, tok = _tiny("llama"), _tokenizer()
    model.generation_config.eos_token_id = tok.eos_token_id
    prompt = "".join(PROMPT_CHARS[i % 7] for i in range(150))
    sample = {"prompt": prompt, "max_new_tokens": 8}
    knobs = dict(segment_len=64, tau=0.3, block_m=16, block_n=16, impl="reference")
    with torch.inference_mode(), sparse_prefill(model, "s2o", **knobs) as run:
        rec = accuracy.generate_one(model, tok, run, sample, False, ["\n"], lambda: None)
        assert run.decode_calls == rec["decode_steps"] * 2
    assert set(rec) == {
        "prompt_tokens", "new_tokens", "prediction", "density", "density_per_layer",
        "prefill_ms", "decode_ms", "estimate_ms", "decode_steps", "loop_ms",
    }  # fmt: skip
    assert rec["prompt_tokens"] == 150 and 1 <= rec["new_tokens"] <= 8
    assert rec["decode_steps"] == rec["new_tokens"] - 1 and "\n" not in rec["prediction"]
    assert rec["decode_ms"] == pytest.approx(rec["loop_ms"] - rec["prefill_ms"])
    assert 0 < rec["density"] < 1


# ---------------------------------------------------------------- several prompts at once


def _one_at_a_time(model, prompts, budgets, **kw):
    return [greedy_decode(model, ids, n, **kw) for ids, n in zip(prompts, budgets)]


def _batch(model, prompts, budgets, **kw):
    from experiments.decode import greedy_decode_batch, prefill

    items = [prefill(model, ids, n) for ids, n in zip(prompts, budgets)]
    return greedy_decode_batch(model, items, **kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_batch_decode_gives_each_prompt_the_tokens_it_gets_alone(arch):
    """Prompts of 5-40 tokens (Gemma 3: shorter and longer than its sliding window of 16), each
    with its own budget, one of them ending on EOS early: the same tokens, stops and steps as
    greedy_decode one prompt at a time; rows leave the batch as they stop."""
    model = _tiny(arch)
    prompts = [_prompt(n) for n in (*LENGTHS, 17, 3)]
    budgets = [N, 7, N, 3, 9, 1]  # the last stops at its first token
    free = _one_at_a_time(model, prompts, budgets)
    # an EOS that the 40-token prompt emits at step 2 and the others never before their budget
    eos = free[3].tokens.tolist()[2]
    model.generation_config.eos_token_id = eos
    ref = _one_at_a_time(model, prompts, budgets)
    got = _batch(model, prompts, budgets)
    assert [g.tokens.tolist() for g in got] == [r.tokens.tolist() for r in ref]
    assert [g.stopped for g in got] == [r.stopped for r in ref]
    assert [g.decode_steps for g in got] == [r.decode_steps for r in ref]
    assert {r.stopped for r in ref} >= {"eos", "max_new_tokens"}, "the test tests one stop only"
    rows = sum(r.decode_steps > 0 for r in ref)  # those that stop at their first token never
    assert rows >= 4 and [g.batch for g in got] == [rows if r.decode_steps else 1 for r in ref]
    assert got[-1].decode_steps == 0 and got[-1].decode_ms == 0
    assert all(g.prefill_ms > 0 for g in got) and sum(g.decode_ms for g in got) > 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_batch_decode_stops_on_stop_strings_as_alone(arch):
    model, tok = _tiny(arch), _tokenizer()
    model.generation_config.eos_token_id = tok.eos_token_id
    prompts = [_prompt(n) for n in LENGTHS]
    stopped_by_string = 0
    for stop in (["\n"], ["a", "."], ["b"]):
        ref = _one_at_a_time(model, prompts, [24] * 4, tokenizer=tok, stop=stop)
        got = _batch(model, prompts, [24] * 4, tokenizer=tok, stop=stop)
        assert [g.tokens.tolist() for g in got] == [r.tokens.tolist() for r in ref], stop
        assert [g.stopped for g in got] == [r.stopped for r in ref], stop
        stopped_by_string += sum(g.stopped == "stop_string" for g in got)
    assert stopped_by_string >= 4, "the stop strings never ended decoding: the test tests nothing"


def test_batch_decode_inside_sparse_prefill_and_its_forwards():
    """Each prompt's prefill runs sparse through the plug-in (batch 1, unpadded); the batched
    decode forwards go dense with the padding mask, one per step for the rows still decoding."""
    from experiments.decode import greedy_decode_batch, prefill

    model = _tiny("llama")
    prompts = [_prompt(n) for n in (192, 130, 160)]
    knobs = dict(segment_len=64, tau=0.3, block_m=16, block_n=16, impl="reference")
    with sparse_prefill(model, "s2o", **knobs) as run:
        ref = _one_at_a_time(model, prompts, [6, 3, 6])
        run.reset()
        items = []
        for ids, n in zip(prompts, [6, 3, 6]):
            items.append(prefill(model, ids, n))
            assert len(run.prefills) == len(items) and 0 < run.stats.density < 1
        seen = []
        hook = model.register_forward_pre_hook(
            lambda m, a, k: seen.append(tuple(k["input_ids"].shape)), with_kwargs=True
        )
        try:
            got = greedy_decode_batch(model, items)
        finally:
            hook.remove()
        assert len(run.prefills) == 3  # the decode forwards are not prefills
    assert [g.tokens.tolist() for g in got] == [r.tokens.tolist() for r in ref]
    assert seen == [(3, 1)] * 2 + [(2, 1)] * 3  # the 3-token budget leaves after 2 steps
    assert all(p.cache is None for p in items)  # merged, then released


def test_batch_decode_refusals():
    from experiments.decode import greedy_decode_batch, prefill

    model = _tiny("llama")
    with pytest.raises(ValueError, match="no prompts"):
        greedy_decode_batch(model, [])
    items = [prefill(model, _prompt(n), 4) for n in (5, 9)]
    greedy_decode_batch(model, items)
    with pytest.raises(ValueError, match="fresh prefill"):
        greedy_decode_batch(model, items)  # each used once: the caches went into the batch
    with pytest.raises(ValueError, match="max_new_tokens"):
        prefill(model, _prompt(5), 0)
    items = [prefill(model, _prompt(n), 4) for n in (5, 9)]
    items[1].cache.layers[1].keys = items[1].cache.layers[1].keys[..., :4, :]
    with pytest.raises(ValueError, match="layer 1 holds 4 positions of a 9-token prompt"):
        greedy_decode_batch(model, items)
    assert all(layer.keys is not None for p in items for layer in p.cache.layers)  # untouched
