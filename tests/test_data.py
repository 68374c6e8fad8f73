"""Inputs of the operator study: synthetic generator, saved tensors, model capture (tiny models)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from harness_util import ROOT, run_inprocess  # noqa: F401  (puts the repo root on sys.path)

from eval.data import load_layers
from eval.synthetic import SyntheticSpec, synthetic_qkv


def test_synthetic_is_deterministic_and_seeded():
    spec = SyntheticSpec(L=300, heads_q=4, heads_kv=2, head_dim=32)
    a, b = synthetic_qkv(spec), synthetic_qkv(spec)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = synthetic_qkv(SyntheticSpec(L=300, heads_q=4, heads_kv=2, head_dim=32, seed=1))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (1, 4, 300, 32) and a[1].shape == (1, 2, 300, 32) == a[2].shape


def test_synthetic_plants_the_sink_and_the_slash():
    spec = SyntheticSpec(L=512, heads_q=1, heads_kv=1, head_dim=128, frac_horizontal=0.0)
    q, k, _ = synthetic_qkv(spec)
    s = q[0, 0] @ k[0, 0].T / math.sqrt(spec.head_dim)
    sink = s[1:, 0]
    assert torch.allclose(sink, torch.full_like(sink, spec.sink), atol=1e-3), sink[:5]
    causal = torch.ones_like(s, dtype=torch.bool).tril(-1)
    background = s[causal].median()
    # the planted offset is the diagonal with the highest mean score (away from the local band)
    means = torch.stack([s.diagonal(-d)[: 512 - 256].mean() for d in range(16, 256)])
    assert float(means.max() - background) > 0.6 * spec.slash, (float(means.max()), background)


def test_file_source_roundtrip_and_truncation(tmp_path):
    from safetensors.torch import save_file

    q, k, v = synthetic_qkv(SyntheticSpec(L=64, heads_q=2, heads_kv=1, head_dim=16))
    save_file({"q.3": q, "k.3": k, "v.3": v}, str(tmp_path / "t.safetensors"))
    data = {"source": "file", "path": str(tmp_path / "t.safetensors"), "L": 40, "layers": None}
    layers, info = load_layers(data, None, torch.device("cpu"), torch.float32)
    (lid, q2, k2, v2) = layers[0]
    assert lid == 3 and torch.equal(q2, q[:, :, :40]) and torch.equal(v2, v[:, :, :40])
    with pytest.raises(
        ValueError, match=r"q\.0, k\.0, v\.0 missing.*the file has q\.3, k\.3, v\.3$"
    ):
        load_layers({**data, "layers": [0]}, None, torch.device("cpu"), torch.float32)


def test_file_without_a_tensor_names_the_missing_key(tmp_path):
    """Was: "layers [0] not found; the file has [0]" for a file with q.0 and k.0 but no v.0."""
    from safetensors.torch import save_file

    q, k, _ = synthetic_qkv(SyntheticSpec(L=64, heads_q=2, heads_kv=1, head_dim=16))
    path = tmp_path / "t.safetensors"
    save_file({"q.0": q, "k.0": k}, str(path))
    data = {"source": "file", "path": str(path), "L": None, "layers": None}
    with pytest.raises(ValueError, match=r": v\.0 missing .*; the file has q\.0, k\.0$"):
        load_layers(data, None, torch.device("cpu"), torch.float32)
    save_file({"x": q}, str(path))
    with pytest.raises(ValueError, match=r"no q\.<layer> tensor .*; the file has x$"):
        load_layers(data, None, torch.device("cpu"), torch.float32)


WORDS = [f"w{i}" for i in range(60)]


def _tiny_model(tmp_path, arch: str):
    """A randomly initialised tiny Llama / Qwen3 and a word-level tokenizer, saved locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    common = dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512)  # fmt: skip
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    path = tmp_path / arch
    torch.manual_seed(0)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    text = tmp_path / "text.txt"
    g = torch.Generator().manual_seed(0)
    text.write_text(" ".join(WORDS[i] for i in torch.randint(0, 60, (400,), generator=g)))
    return path, text


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_capture_tiny_model_and_cache(arch, tmp_path):
    from eval.capture import captured_layers

    path, text = _tiny_model(tmp_path, arch)
    model_cfg = {"path": str(path), "dtype": "float32", "rope_scaling": None}
    data = {"source": "model", "L": 96, "layers": [0, 2], "text": str(text),
            "cache_dir": str(tmp_path / "cache")}  # fmt: skip
    layers, info = load_layers(data, model_cfg, torch.device("cpu"), torch.float32)
    assert not info["cache_hit"] and [lid for lid, *_ in layers] == [0, 2]
    _, q, k, v = layers[0]
    hd = 16
    assert q.shape == (1, 4, 96, hd) and k.shape == (1, 2, 96, hd) == v.shape
    again, info2 = load_layers(data, model_cfg, torch.device("cpu"), torch.float32)
    assert info2["cache_hit"] and torch.equal(again[1][1], layers[1][1])
    assert captured_layers(data, model_cfg, torch.device("cpu"))[1]


def test_llama_capture_is_post_rope(tmp_path):
    """Layer 0's captured q equals RoPE(q_proj(norm(embed(ids)))) computed by hand."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from eval.capture import capture_qkv, load_model, tokenize

    path, text = _tiny_model(tmp_path, "llama")
    model, tok = load_model({"path": str(path), "dtype": "float32"}, torch.device("cpu"))
    ids = tokenize(tok, text.read_text(), 64)
    got = capture_qkv(model, ids, [0])
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        h = ref.model.embed_tokens(ids)
        attn = ref.model.layers[0].self_attn
        x = ref.model.layers[0].input_layernorm(h)
        qp = attn.q_proj(x).view(1, 64, -1, 16).transpose(1, 2)
        kp = attn.k_proj(x).view(1, 64, -1, 16).transpose(1, 2)
        cos, sin = ref.model.rotary_emb(x, torch.arange(64)[None])
        q_rot, k_rot = apply_rotary_pos_emb(qp, kp, cos, sin)
    q, k, _ = got[0]
    assert torch.allclose(q, q_rot, atol=1e-5), float((q - q_rot).abs().max())
    assert torch.allclose(k, k_rot, atol=1e-5), float((k - k_rot).abs().max())
    assert not torch.allclose(q, qp, atol=1e-3), "captured q equals the pre-RoPE projection"


def test_harness_runs_on_captured_model(tmp_path):
    path, text = _tiny_model(tmp_path, "qwen3")
    rec = run_inprocess(
        ["data=model", "model=qwen3_8b", f"model.path={path}", "model.dtype=float32",
         "model.rope_scaling=null", f"data.text={text}", "data.L=256", "data.layers=[0,2]",
         f"data.cache_dir={tmp_path}/cache", "S=128", "timing.enabled=false"],
        tmp_path,
    )  # fmt: skip
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["metrics"]["shape"]["layers"] == 2 and len(rec["metrics"]["per_layer"]) == 2


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the realmodel extra")
def test_capture_real_embedded_model_on_essays(tmp_path):
    """data=model with SmolLM2-135M (GGUF from PyPI) on Paul Graham's essays, default layers."""
    import os

    from harness_util import compose  # noqa: I001
    from omegaconf import OmegaConf

    cfg = compose(["data=model", "model=smollm2_135m", "data.L=128", "model.dtype=float32",
                   f"data.cache_dir={tmp_path}/qkv"])  # fmt: skip
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["cache_dir"] = os.environ.get("S2O_CACHE", "cache") + "/models"
    data = OmegaConf.to_container(cfg.data, resolve=True)
    layers, info = load_layers(data, model_cfg, torch.device("cpu"), torch.float32)
    assert [lid for lid, *_ in layers] == [0, 15, 29] and not info["cache_hit"]
    _, q, k, v = layers[1]
    assert q.shape == (1, 9, 128, 64) and k.shape == (1, 3, 128, 64) == v.shape
    assert torch.isfinite(q).all() and q.abs().max() > 0


def test_synthetic_input_cache_saves_once_and_loads_the_same_tensors(tmp_path):
    data = {"source": "synthetic", "L": 256, "batch": 1, "heads_q": 4, "heads_kv": 2,
            "head_dim": 32, "seed": 3}  # fmt: skip
    built, info = load_layers(data, None, "cpu", torch.bfloat16)
    assert "cache" not in info
    first, info1 = load_layers(data, None, "cpu", torch.bfloat16, tmp_path / "inputs")
    second, info2 = load_layers(data, None, "cpu", torch.bfloat16, tmp_path / "inputs")
    assert (info1["cache_hit"], info2["cache_hit"]) == (False, True)
    assert info1["cache"] == info2["cache"] and len(list((tmp_path / "inputs").iterdir())) == 1
    for a, b, c in zip(built[0][1:], first[0][1:], second[0][1:]):
        assert a.dtype == c.dtype == torch.bfloat16 and torch.equal(a, b) and torch.equal(a, c)
    # another seed or dtype is another file
    _, info3 = load_layers({**data, "seed": 4}, None, "cpu", torch.bfloat16, tmp_path / "inputs")
    _, info4 = load_layers(data, None, "cpu", torch.float32, tmp_path / "inputs")
    assert not info3["cache_hit"] and not info4["cache_hit"]
    assert len({info1["cache"], info3["cache"], info4["cache"]}) == 3
    # a truncated file is named, never silently rebuilt
    path = tmp_path / "inputs" / info1["cache"].rsplit("/", 1)[1]
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"{path}: cannot read this cached synthetic input"):
        load_layers(data, None, "cpu", torch.bfloat16, tmp_path / "inputs")


def test_input_cache_is_not_part_of_a_points_identity(tmp_path, monkeypatch):
    from experiments import operator

    monkeypatch.setattr(operator, "PROCESS_DATA", {})  # this process's last input: not shared
    base = ["method=s2o", "dry_run=true", "timing.enabled=false"]
    fresh = run_inprocess(base, tmp_path)
    again = run_inprocess([*base, f"input_cache={tmp_path / 'inputs'}"], tmp_path)
    assert again["skipped"] and again["path"] == fresh["path"]  # the same point: done already
    monkeypatch.setattr(operator, "PROCESS_DATA", {})
    other = run_inprocess([*base, "skip_done=false", f"input_cache={tmp_path / 'inputs'}"],
                          tmp_path / "b")  # fmt: skip
    assert other["id"] == fresh["id"] and other["metrics"]["mse"] == fresh["metrics"]["mse"]
    assert other["metrics"]["data"]["cache"].startswith(str(tmp_path / "inputs"))


def test_a_rewritten_data_file_is_not_served_from_the_process_cache(tmp_path, monkeypatch):
    """Two points of one process on data=file: a file rewritten between them is read again."""
    from safetensors.torch import save_file

    from experiments import operator

    monkeypatch.setattr(operator, "PROCESS_DATA", {})
    path = tmp_path / "t.safetensors"
    base = ["method=s2o", "data=file", f"data.path={path}", "timing.enabled=false",
            "device=cpu", "S=256", "skip_done=false"]  # fmt: skip
    mse = []
    for seed in (0, 1):
        q, k, v = synthetic_qkv(SyntheticSpec(L=512, heads_q=2, heads_kv=1, head_dim=16, seed=seed))
        save_file({"q.0": q, "k.0": k, "v.0": v}, str(path))
        mse.append(run_inprocess(base, tmp_path / f"r{seed}")["metrics"]["mse"])
    assert mse[0] != mse[1]
