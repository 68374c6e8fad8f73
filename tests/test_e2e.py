"""Model configs and the time-to-first-token job (kind=e2e) on tiny random-weight architectures."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from harness_util import compose, run_inprocess  # noqa: E402

pytestmark = pytest.mark.models  # re-run on the oldest accepted transformers (.ci/run)

SHRINK = ["model.weights=random", "model.arch.vocab_size=500", "model.arch.hidden_size=288",
          "model.arch.intermediate_size=256"]  # fmt: skip


@pytest.mark.parametrize(
    "name", ["gemma3_270m", "smollm2_135m", "llama31_8b", "qwen3_8b", "qwen25_coder_1p5b"]
)
def test_model_configs_build_their_architecture(name):
    from omegaconf import OmegaConf

    from eval import models

    mc = OmegaConf.to_container(compose([f"model={name}", *SHRINK]).model, resolve=True)
    full_layers = mc["arch"]["num_hidden_layers"]
    mc["arch"]["num_hidden_layers"] = 6 if name == "gemma3_270m" else 2
    if name == "gemma3_270m":
        mc["arch"]["layer_types"] = mc["arch"]["layer_types"][:6]
    mc["dtype"] = "float32"
    before = copy.deepcopy(mc)
    model, tok = models.load(mc, torch.device("cpu"))
    assert mc == before, "loading wrote into the run's model config (hashed into its id)"
    assert tok is None and model.config.num_hidden_layers == mc["arch"]["num_hidden_layers"]
    layers = {"gemma3_270m": 18, "smollm2_135m": 30, "llama31_8b": 32, "qwen3_8b": 36,
              "qwen25_coder_1p5b": 28}  # fmt: skip
    assert full_layers == layers[name]
    assert "random weights" in models.describe(mc)
    if name == "qwen3_8b":
        assert model.config.rope_parameters["rope_type"] == "yarn"


def test_model_config_errors_name_the_key(tmp_path):
    from eval import models

    with pytest.raises(ValueError, match="weights='nope'"):
        models.normalize({"name": "x", "path": "p", "weights": "nope"})
    with pytest.raises(ValueError, match="source='ftp'"):
        models.normalize({"name": "x", "path": "p", "source": "ftp"})
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        models.load({"name": "x", "source": "gguf", "path": str(tmp_path), "gguf_file": "m.gguf"},
                    torch.device("cpu"))  # fmt: skip
    with pytest.raises(ValueError, match="weights=random needs an `arch`"):
        models.load({"name": "x", "weights": "random"}, torch.device("cpu"))


def test_e2e_job_records_breakdown_and_speedups(tmp_path):
    arch = ["model.arch.num_hidden_layers=2", "model.arch.num_attention_heads=4",
            "model.arch.num_key_value_heads=2", "model.arch.head_dim=32"]  # fmt: skip
    rec = run_inprocess(
        ["kind=e2e", "model=llama31_8b", *SHRINK, *arch, "e2e.lengths=[256,384]",
         "e2e.dense=[flash]", "e2e.methods=[pbs,{name:s2o,tau:0.05}]", "e2e.reps=2",
         "e2e.warmup=0",
         "method.segment_len=128", "method.block_m=32", "method.block_n=32", "tau=0.3",
         "device=cpu"],
        tmp_path,
    )  # fmt: skip
    assert rec["status"] == "ok", rec.get("traceback")
    assert "/e2e/llama31_8b/s2o/" in rec["path"]
    m = rec["metrics"]
    assert m["weights"] == "random" and m["text"] == "random token ids"
    # the stored config is the one its id hashes (llama3's rope dict was written into at 28c75f4)
    from experiments import records as common

    cfg, idn = rec["config"], rec["identity"]
    assert common.config_id(cfg, common._drop_for(cfg), None) == idn["config_id"]
    rows = {(r["L"], r["label"]): r for r in m["rows"]}
    assert set(rows) == {
        (L, c)
        for L in (256, 384)
        for c in ("full_flash", "sdpa_stock", "s2o", "pbs", "s2o_tau0.05")
    }
    # a smaller tau stops later: at least the default row's (tau=0.3) density
    assert rows[(384, "s2o_tau0.05")]["density"] >= rows[(384, "s2o")]["density"]
    s2o, flash = rows[(384, "s2o")], rows[(384, "full_flash")]
    assert s2o["sparse_layers"] == [0, 1] and 0 < s2o["density"] < 1
    assert len(s2o["wall_ms"]) == 2 and s2o["total_ms"] > 0
    assert s2o["speedup_vs_flash"] == pytest.approx(flash["total_ms"] / s2o["total_ms"])
    assert flash["attention_bound_vs_flash"] > 1
    attn = flash["sparse_attention_ms"]  # Amdahl at the row's density, from the flash run
    ideal = flash["total_ms"] - attn + s2o["density"] * attn
    assert s2o["amdahl_bound_vs_flash"] == pytest.approx(flash["total_ms"] / ideal)
    assert s2o["share_of_amdahl"] == pytest.approx(
        s2o["speedup_vs_flash"] / s2o["amdahl_bound_vs_flash"]
    )
    assert "amdahl_bound_vs_flash" not in flash
    parts = s2o["estimate_ms"] + s2o["sparse_attention_ms"] + s2o["rest_ms"]
    assert parts == pytest.approx(s2o["total_ms"], rel=0.5)  # events of the median run vs its wall


def test_e2e_lengths_default_to_powers_of_two_up_to_max_len():
    from experiments.e2e import lengths

    assert lengths({"lengths": None}, {"max_len": 32768}) == [8192, 16384, 32768]
    with pytest.raises(ValueError, match="outside"):
        lengths({"lengths": [70000]}, {"max_len": 32768})


def test_e2e_table_reads_a_record(tmp_path):
    import json

    from analysis.e2e_table import table

    rec = {
        "status": "ok",
        "environment": {"device_name": "GPU", "torch": "t", "triton": "x", "git_revision": "abc"},
        "metrics": {"model": "m", "text": "essays", "dtype": "bfloat16", "rows": [
            {"label": "s2o", "L": 8, "density": 0.5, "total_ms": 2.0, "speedup_vs_flash": 2.0},
            {"label": "full_flash", "L": 8, "density": 1.0, "total_ms": 4.0},
            {"label": "pbs", "L": 8, "error": "OutOfMemoryError: x"},
        ]},
    }  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(rec))
    lines = table(rec, "r.json").splitlines()
    assert lines[4].startswith("| full_flash | 8 | 1.000 |")  # dense rows first at each length
    assert "| s2o | 8 | 0.500 | - |" in lines[5] and "| 2.00 |" in lines[5]
    assert "OutOfMemoryError" in lines[6]


def test_e2e_on_a_cpu_refuses_long_prefills_before_loading(tmp_path):
    rec = run_inprocess(["kind=e2e", "model=gemma3_270m", "device=cpu"], tmp_path)
    assert rec["status"] == "error" and "e2e.lengths of at most 4096" in rec["error"]
    assert rec["elapsed_s"] < 5, "the model was loaded before the lengths were checked"


def test_e2e_on_a_cpu_refuses_a_cuda_only_dense_backend_before_loading(tmp_path):
    rec = run_inprocess(
        ["kind=e2e", "model=gemma3_270m", "device=cpu", "e2e.lengths=[512]"], tmp_path
    )  # the default e2e.dense is [flash, cudnn]
    assert rec["status"] == "error" and "backend='cudnn' needs CUDA tensors" in rec["error"]
    assert "e2e.dense=[flash] or [math]" in rec["error"]
    assert rec["elapsed_s"] < 5, "the model was loaded before the backends were checked"


def test_e2e_method_entries_with_knobs_are_checked_before_loading(tmp_path):
    for entry, words in (("{name:s2o,bogus:1}", "bogus"), ("{tau:0.1}", "a mapping with `name`")):
        rec = run_inprocess(
            ["kind=e2e", "model=gemma3_270m", "device=cpu", "e2e.lengths=[512]",
             "e2e.dense=[flash]", f"e2e.methods=[{entry}]"],
            tmp_path,
        )  # fmt: skip
        assert rec["status"] == "error" and words in rec["error"], rec["error"]
        assert rec["elapsed_s"] < 5, "the model was loaded before the entries were checked"


def test_e2e_flashprefill_entry_takes_the_model_familys_alpha():
    from experiments.common import ConfigError
    from experiments.e2e import configurations

    def configs(model: dict, methods: list) -> dict:
        resolved = {"method_name": "full", "method": {}, "model": model,
                    "e2e": {"dense": ["flash"], "stock": False, "methods": methods}}  # fmt: skip
        return {label: knobs for label, _, knobs in configurations(resolved)}

    qwen = {"name": "qwen25_coder_1p5b", "arch": {"model_type": "qwen2"}}
    got = configs(qwen, ["flashprefill", {"name": "flashprefill", "dense_tail_tiles": 8}])
    assert got["flashprefill"] == {"alpha": 0.08}
    assert got["flashprefill_dense_tail_tiles8"] == {"alpha": 0.08, "dense_tail_tiles": 8}
    llama = {"name": "llama31_8b", "arch": {"model_type": "llama"}}
    assert configs(llama, ["flashprefill"])["flashprefill"] == {"alpha": 0.18}
    gemma = {"name": "gemma3_270m", "arch": {"model_type": "gemma3_text"}}
    assert configs(gemma, [{"name": "flashprefill", "alpha": 0.3}])["flashprefill_alpha0.3"] == {
        "alpha": 0.3
    }
    with pytest.raises(ConfigError, match="model=gemma3_270m.*no alpha.*alpha: 0.18"):
        configs(gemma, ["flashprefill"])


def test_e2e_flashprefill_without_an_official_alpha_fails_before_loading(tmp_path):
    rec = run_inprocess(
        ["kind=e2e", "model=gemma3_270m", "device=cpu", "e2e.lengths=[512]", "e2e.dense=[flash]",
         "e2e.methods=[flashprefill]"],
        tmp_path,
    )  # fmt: skip
    assert rec["status"] == "error" and "gemma3_text" in rec["error"], rec["error"]
    assert rec["elapsed_s"] < 5, "the model was loaded before the entries were checked"


def test_ttft_frame_gives_the_amdahl_bound_against_dense_sdpa():
    from analysis.e2e_table import ttft_frame

    rows = [
        {"L": 8, "label": "sdpa_stock", "total_ms": 100.0},
        {"L": 8, "label": "full_cudnn", "total_ms": 110.0, "sparse_attention_ms": 60.0},
        {"L": 8, "label": "s2o", "total_ms": 80.0, "density": 0.5, "estimate_ms": 5.0,
         "sparse_attention_ms": 25.0, "rest_ms": 50.0},
        {"L": 8, "label": "pbs", "total_ms": 120.0, "density": 0.5, "estimate_ms": 5.0,
         "sparse_attention_ms": 65.0, "rest_ms": 50.0},
        {"L": 16, "label": "s2o", "total_ms": 1.0, "density": 0.1},  # no dense rows: left out
    ]  # fmt: skip
    df = ttft_frame([{"metrics": {"rows": rows}}]).set_index("config")
    assert list(df.index) == ["s2o", "pbs"]
    assert df.loc["s2o", "Amdahl bound"] == pytest.approx(100 / (50 + 0.5 * 60))
    assert df.loc["s2o", "vs SDPA"] == pytest.approx(100 / 80)
    assert df.loc["s2o", "share of bound"] == pytest.approx((100 / 80) / (100 / 80))
    assert df.loc["s2o", "target"] == "met" and df.loc["pbs", "target"] == "missed"
