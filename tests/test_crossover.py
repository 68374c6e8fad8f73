"""min_len="auto": the crossover rule, the lookup of crossover records (device, head shape, method
and knobs must all match; smoke records never stand), its error, the stats of a model run with it,
and benchmarks/crossover.py's dry mode writing a record that the lookup reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from experiments.records import write_record
from s2o import crossover as xo
from s2o.methods import METHODS, bind

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def smoke_record(tmp_path_factory) -> dict:
    """benchmarks/crossover.py --smoke, run once (CPU, reference impl, tiny lengths)."""
    from benchmarks import crossover as bench

    out = tmp_path_factory.mktemp("bench")
    rec = bench.main(["--smoke", "--out", str(out)])
    (path,) = (out / "crossover").glob("*/record.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(rec, default=str))
    return rec


def _as_gpu(rec: dict, *, device=H100, heads=(9, 3), D=64, dtype="bfloat16", method="s2o",
            knobs=None, crossover=4096, time="2026-01-01T00:00:00+00:00") -> dict:  # fmt: skip
    """``rec`` (a smoke record) as if measured on a GPU with this key and crossover."""
    rec = copy.deepcopy(rec)
    rec["config"]["smoke"] = False
    rec["config"]["method"] = method
    rec["config"]["knobs"] = dict(bind(method, **(knobs or {})).config)
    rec["config"]["shape"].update(Hq=heads[0], Hkv=heads[1], D=D, dtype=dtype, device="cuda")
    rec["environment"].update(device_name=device, time=time)
    rec["metrics"]["crossover"] = crossover
    return rec


def _key(device=H100, heads=(9, 3), D=64, dtype="bfloat16", method="s2o", knobs=None):
    knobs = dict(bind(method, **(knobs or {})).config)
    return xo.CrossoverKey(device, *heads, D, dtype, method, knobs)


def _write(root: Path, name: str, rec: dict) -> Path:
    path = root / name / "record.json"
    write_record(path, rec)
    return path


def test_crossover_is_the_smallest_length_from_which_on_the_method_pays():
    def rows(*pairs):
        return [{"L": L, "dense_ms": 1.0, "sparse_ms": s} for L, s in pairs]

    # faster at 2048 but not at 4096 (the curve crosses back): the crossover is 8192
    got = rows((1024, 1.5), (2048, 0.9), (4096, 1.01), (8192, 0.9), (16384, 0.5))
    assert xo.crossover_length(got, 0.05) == 8192
    assert xo.crossover_length(rows((1024, 0.96)), 0.05) is None  # 0.96 x 1.05 > 1: not by 5%
    assert xo.crossover_length(rows((1024, 0.96)), 0.0) == 1024
    assert xo.crossover_length(rows((1024, 0.5), (2048, 1.2)), 0.05) is None  # not at the longest
    with pytest.raises(ValueError, match="no rows"):
        xo.crossover_length([], 0.05)
    with pytest.raises(ValueError, match="margin must be >= 0, got -0.1"):
        xo.crossover_length(rows((1024, 0.5)), -0.1)


def test_lookup_takes_the_matching_record_and_no_other(smoke_record, tmp_path):
    base = smoke_record
    _write(tmp_path, "match_old", _as_gpu(base, crossover=8192, time="2026-01-01T00:00:00+00:00"))
    new = _write(tmp_path, "match_new", _as_gpu(base, crossover=4096,
                                                time="2026-02-01T00:00:00+00:00"))  # fmt: skip
    _write(tmp_path, "h200", _as_gpu(base, device="NVIDIA H200", crossover=1024))
    _write(tmp_path, "shape", _as_gpu(base, heads=(32, 8), D=128, crossover=1536))
    _write(tmp_path, "fp16", _as_gpu(base, dtype="float16", crossover=1536))
    _write(tmp_path, "tau", _as_gpu(base, knobs={"tau": 0.02}, crossover=2048))
    _write(tmp_path, "flex", _as_gpu(base, method="flexprefill", crossover=3072))
    smoke = copy.deepcopy(_as_gpu(base, crossover=1024, time="2027-01-01T00:00:00+00:00"))
    smoke["config"]["smoke"] = True
    _write(tmp_path, "smoke", smoke)
    partial = _as_gpu(base, crossover=1024, time="2027-01-01T00:00:00+00:00")
    partial["status"] = "partial"
    _write(tmp_path, "partial", partial)

    found = xo.lookup(_key(), METHODS["s2o"].defaults, tmp_path)
    assert found.min_len == 4096 and found.path == str(new)  # the newest of the two matches
    assert found.longest == max(base["config"]["lengths"])
    assert xo.lookup(_key(knobs={"tau": 0.02}), {}, tmp_path).min_len == 2048
    assert xo.lookup(_key(device="NVIDIA H200"), {}, tmp_path).min_len == 1024
    assert xo.lookup(_key(method="flexprefill"), {}, tmp_path).min_len == 3072
    others = (_key(device="NVIDIA A100-SXM4-80GB"), _key(heads=(9, 1)), _key(D=128),
              _key(dtype="float32"), _key(knobs={"tau": 0.01}), _key(method="xattn"))  # fmt: skip
    for key in others:
        with pytest.raises(LookupError, match="no crossover record"):
            xo.lookup(key, METHODS[key.method].defaults, tmp_path)


def test_the_lookup_error_names_device_shape_method_and_the_command(tmp_path):
    key = _key(device="NVIDIA H100 80GB HBM3", heads=(9, 3), D=64, knobs={"tau": 0.01})
    with pytest.raises(LookupError) as err:
        xo.lookup(key, METHODS["s2o"].defaults, tmp_path)
    msg = str(err.value)
    assert "device 'NVIDIA H100 80GB HBM3', 9/3 heads, head_dim 64, bfloat16" in msg, msg
    assert "method 's2o'" in msg and '"tau": 0.01' in msg, msg
    want = ("`python -m benchmarks.crossover --method s2o --heads 9/3 --head-dim 64 --dtype "
            "bfloat16 --knobs '{\"tau\": 0.01}' --rev $(git rev-parse HEAD)`")  # fmt: skip
    assert want in msg, msg
    assert "Records there are for: none" in msg and "pass an int min_len" in msg, msg


def test_smoke_record_is_well_formed_and_never_stands_for_a_gpu(smoke_record, tmp_path):
    rec = smoke_record
    assert rec["status"] == "ok" and rec["kind"] == "benchmark" and rec["benchmark"] == "crossover"
    assert rec["command"].startswith("python -m benchmarks.crossover --smoke")
    for key in ("device_name", "torch", "triton", "transformers", "git_revision"):
        assert key in rec["environment"], key
    cfg = rec["config"]
    assert cfg["smoke"] is True and cfg["shape"]["device"] == "cpu"
    assert cfg["method"] == "s2o" and cfg["knobs"]["impl"] == "reference"
    assert cfg["knobs"] == dict(bind("s2o", **cfg["knobs"]).config)  # every knob, validated
    rows = rec["metrics"]["rows"]
    assert [r["L"] for r in rows] == cfg["lengths"] == [64, 96, 160]
    for r in rows:
        assert r["dense_ms"] > 0 and r["sparse_ms"] > 0 and r["estimate_ms"] > 0
        assert 0 < r["density"] <= 1
        assert r["speedup"] == pytest.approx(r["dense_ms"] / r["sparse_ms"])
    assert rec["metrics"]["crossover"] == xo.crossover_length(rows, cfg["margin"])
    assert xo.record_key(rec) is None  # a CPU smoke run is never a GPU's crossover
    _write(tmp_path, rec["id"], rec)
    key = xo.CrossoverKey(rec["environment"]["device_name"], 2, 1, 16, "float32", "s2o",
                          cfg["knobs"])  # fmt: skip
    with pytest.raises(LookupError, match="Records there are for: none"):
        xo.lookup(key, {}, tmp_path)


def test_committed_records_stand_for_a_default_s2o_run_after_mean_correction():
    """The committed S2O crossover records, made before ``mean_correction`` (an optional knob, off
    by default) existed or with it off, stand for a run that leaves it off, and not for one that
    sets it."""
    recs = [json.loads(p.read_text()) for p in sorted(xo.RECORDS.glob("*/record.json"))]
    recs = [r for r in recs if xo.record_key(r) is not None and r["config"]["method"] == "s2o"]
    assert recs, "no committed S2O crossover record"
    assert any("mean_correction" not in r["config"]["knobs"] for r in recs)  # one predates it
    for rec in recs:
        cfg, shape = rec["config"], rec["config"]["shape"]
        assert not cfg["knobs"].get("mean_correction")
        for on in (False, True):
            knobs = dict(bind("s2o", **{**cfg["knobs"], "mean_correction": on}).config)
            key = xo.CrossoverKey(rec["environment"]["device_name"], shape["Hq"], shape["Hkv"],
                                  shape["D"], shape["dtype"], "s2o", knobs)  # fmt: skip
            if on:
                with pytest.raises(LookupError, match=r'"mean_correction": true'):
                    xo.lookup(key, METHODS["s2o"].defaults)
            else:  # found (a LookupError otherwise), and it is a committed record
                found = xo.lookup(key, METHODS["s2o"].defaults)
                assert found.path.startswith("results/benchmarks/crossover/"), found.path


def test_flashprefill_record_keeps_layer_knobs_out(tmp_path):
    from benchmarks import crossover as bench

    rec = bench.main(["--smoke", "--out", str(tmp_path), "--method", "flashprefill",
                      "--knobs", '{"alpha": 0.1, "block_size": 16}'])  # fmt: skip
    assert "dense_first_layers" not in rec["config"]["knobs"]
    assert rec["config"]["knobs"]["alpha"] == 0.1


# ---------------------------------------------------------------- sparse_prefill(min_len="auto")

transformers = pytest.importorskip("transformers")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _ids(n: int) -> torch.Tensor:
    return torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(1))


KNOBS = dict(tau=0.3, segment_len=64, block_m=16, block_n=16)


@pytest.fixture()
def h100(monkeypatch, tmp_path):
    """This process 'on an H100' with its crossover records in ``tmp_path``."""
    import s2o.hf

    monkeypatch.setattr(s2o.hf, "device_name", lambda device: H100)
    monkeypatch.setattr(xo, "RECORDS", tmp_path)
    return tmp_path


def test_auto_min_len_resolves_once_and_the_stats_show_it(smoke_record, h100):
    from s2o.hf import sparse_prefill

    path = _write(h100, "tiny", _as_gpu(smoke_record, heads=(4, 2), D=32, dtype="float32",
                                        knobs=KNOBS, crossover=100))  # fmt: skip
    model = _tiny_llama()
    with torch.no_grad(), sparse_prefill(model, "s2o", min_len="auto", **KNOBS) as run:
        model(_ids(64))
        model(_ids(128))
    short, long = run.prefills
    rev = smoke_record["environment"]["git_revision"]
    source = f"{path} (revision {rev})"
    assert run.min_len == 100 and run.min_len_source == source
    assert {s.reason for s in short.layers} == {f"L=64 < min_len=100 (auto: {source})"}
    assert long.sparse_layers == [0, 1]
    assert long.summary()["min_len"] == {"value": 100, "source": source}
    reason = f"L=64 < min_len=100 (auto: {source})"
    assert short.summary()["dense_layers"] == {0: reason, 1: reason}


def test_auto_min_len_never_pays_keeps_every_prefill_dense(smoke_record, h100):
    from s2o.hf import sparse_prefill

    _write(h100, "tiny", _as_gpu(smoke_record, heads=(4, 2), D=32, dtype="float32", knobs=KNOBS,
                                 crossover=None))  # fmt: skip
    model = _tiny_llama()
    with torch.no_grad(), sparse_prefill(model, "s2o", min_len="auto", **KNOBS) as run:
        model(_ids(128))
    st = run.stats
    assert st.sparse_layers == [] and st.summary()["min_len"]["value"] is None
    assert all(s.reason.startswith("min_len=auto: not faster than dense at any length measured")
               for s in st.layers)  # fmt: skip


def test_auto_min_len_without_a_record_fails_on_entering(h100):
    from s2o.hf import sparse_prefill

    model = _tiny_llama()
    with pytest.raises(LookupError, match=r"4/2 heads, head_dim 32, float32, method 's2o'"):
        with sparse_prefill(model, "s2o", min_len="auto", **KNOBS):
            pass
    assert model.config._attn_implementation == "sdpa"


def test_auto_min_len_off_the_gpu_and_bad_values_are_refused():
    from s2o.hf import sparse_prefill

    model = _tiny_llama()
    with pytest.raises(ValueError, match=r"min_len='auto' reads a crossover measured on a GPU"):
        sparse_prefill(model, "s2o", min_len="auto", **KNOBS).__enter__()
    assert model.config._attn_implementation == "sdpa"
    for bad in ("fast", 1.5, True):
        with pytest.raises(ValueError, match=f"min_len must be an int >= 0 or 'auto', got {bad!r}"):
            sparse_prefill(model, "s2o", min_len=bad)


def test_given_min_len_is_reported_as_given():
    from s2o.hf import sparse_prefill

    model = _tiny_llama()
    with torch.no_grad(), sparse_prefill(model, "s2o", min_len=100, **KNOBS) as run:
        model(_ids(64))
    assert run.stats.summary()["min_len"] == {"value": 100, "source": "given"}
