"""benchmarks/: every script runs end to end in its CPU smoke mode (Triton interpreter, tiny
shapes, without the harness's packages) and writes one record in the harness's schema; the
analysis reads those records and the migrated old ones; the ABCD variant B reads the same keys as
Step 1's ranked sets; no two benchmark files import each other in a circle."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from harness_util import ROOT

from analysis import bench_records as br
from analysis import bench_sections

SMOKE_RUNS = {
    "abcd": [],
    "retrieval_latency": [],
    "bench_baselines": [],
    # every optional part once: tuning, the stop-check sweep, the Step-1 breakdown, ABCD
    "bench_s2o": [
        "--abcd",
        "--tune",
        "--sweep",
        "1",
        "--step1-breakdown",
        "1",
    ],
    "fig5_bsa": ["--lengths", "160", "--ratios", "0.5"],  # tests/test_fig5_bsa.py checks more
}


# The benchmarks run where only torch and Triton are installed (the GPU machines): the harness's
# packages are made unimportable in the smoke runs.
HARNESS_ONLY = ("omegaconf", "hydra", "pandas", "yaml", "wandb", "matplotlib")
RUN_WITHOUT = (
    "import runpy, sys\n"
    "for name in {blocked!r}: sys.modules[name] = None\n"
    "sys.argv = [{module!r}, *sys.argv[1:]]\n"
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
)


def _smoke(name: str, out) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    code = RUN_WITHOUT.format(blocked=HARNESS_ONLY, module=f"benchmarks.{name}")
    cmd = [sys.executable, "-c", code, "--smoke", "--out", str(out), *SMOKE_RUNS[name]]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = (out / name).glob("*/record.json")
    return json.loads(path.read_text()) | {"_path": str(path)}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return {name: _smoke(name, out) for name in SMOKE_RUNS}, out


@pytest.mark.interpreter
@pytest.mark.parametrize("name", list(SMOKE_RUNS))
def test_smoke_run_writes_one_record_in_the_harness_schema(records, name):
    rec = records[0][name]
    assert rec["status"] == "ok" and rec["kind"] == "benchmark" and rec["benchmark"] == name
    assert rec["command"].startswith(f"python -m benchmarks.{name} --smoke")
    for key in ("device_name", "driver", "torch", "triton", "transformers", "git_revision"):
        assert key in rec["environment"], key
    assert rec["config"]["shape"]["device"] == "cpu" and rec["config"]["smoke"] is True
    assert rec["identity"]["id"] == rec["id"] and rec["_path"].endswith(f"{rec['id']}/record.json")
    m = rec["metrics"]
    if name == "abcd":
        assert {(r["L"], r["causal"]) for r in m["rows"]} == {(128, True), (128, False)}
        assert all(r[v] > 0 for r in m["rows"] for v in br.ABCD)
    elif name == "retrieval_latency":
        assert {(r["L"], r["S"]) for r in m["rows"]} == {
            (L, S) for L in (96, 160) for S in (32, 64)
        }
        assert [f["L"] for f in m["flash"]] == [96, 160]
    elif name == "bench_baselines":
        want = {"full_math", "flexprefill", "xattn", "pbs", "flashprefill"}
        assert {r["method"] for r in m["methods"]} >= want
        assert rec["config"]["knobs"] == {"flashprefill": {"alpha": 0.18}}
        assert not [r for r in m["methods"] if "error" in r], m["methods"]
        assert {r["target_density"] for r in m["kernel"]} == {0.05, 0.10, 0.25, 0.50, 1.0}
    elif name == "fig5_bsa":
        assert {r["method"] for r in m["rows"]} == {"s2o_topk", "s2o_topk_fused", "bsa"}
    else:
        (length,) = m["lengths"]
        assert set(length["abcd"]) == set(br.ABCD) and length["full_ms"]["math"] > 0
        assert [p["tau"] for p in length["s2o"]["sparse"]] == [0.002, 0.005, 0.02]
        assert m["sweep"] and m["step1_breakdown"]["variants"] and m["tune_trials"]


@pytest.mark.interpreter
def test_the_analysis_reads_the_smoke_records(records, tmp_path):
    """Both ABCD tables and the overhead table with ours per case, from an ``abcd`` record; the
    retrieval table with the record's own Step-1 rows."""
    recs, out = records
    pins = {"kernels": {"abcd": str(recs["abcd"]["_path"]),
                        "step1": str(recs["retrieval_latency"]["_path"])}}  # fmt: skip
    ctx = type("Ctx", (), {"results": out, "manifest": {"records": pins},
                           "paper": yaml.safe_load((ROOT / "analysis" / "paper_numbers.yaml")
                                                   .read_text())})()  # fmt: skip
    sec = bench_sections.abcd(ctx)
    text = "\n".join(sec.body)
    assert "Causal, kernel-only ms" in text and "Non-causal, kernel-only ms" in text, text
    assert "| transition | 128 | 128 non-causal | paper (causal) |" in text, text
    assert not sec.missing, sec.missing
    frame = br.abcd_frame(recs["abcd"])
    a_to_b = (frame["B"] / frame["A"] - 1) * 100
    assert all(f"{x:+.1f}%" in text for x in a_to_b), (list(a_to_b), text)
    assert "PARTIAL" not in sec.sources[0]
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({**recs["abcd"], "status": "partial"}))
    ctx.manifest = {"records": {"kernels": {**pins["kernels"], "abcd": str(cut)}}}
    assert "PARTIAL" in bench_sections.abcd(ctx).sources[0]  # a cut-off run says so
    sec = bench_sections.retrieval(ctx)
    assert sec.sources and "chunks S=512" in "\n".join(sec.body)
    table = "\n".join(sec.body)
    ms = br.step1_frame(recs["retrieval_latency"])
    assert len(ms) == 4 and "| 4K |" in table  # the paper's rows stay, ours have L < 1K


# One record of each former layout (byte copies of committed records before their one-off
# migration to the harness's schema, gone since: git show 74cbbc6)
LEGACY = ROOT / "tests" / "data" / "legacy_records"


@pytest.mark.parametrize("name", ["bench_s2o", "step1_probe", "pass2_probe", "bench_baselines"])
def test_analysis_refuses_a_record_of_an_old_layout(name):
    old = json.loads((LEGACY / f"{name}.json").read_text())
    with pytest.raises(br.SchemaError, match="not a benchmark record.*former layout.*74cbbc6"):
        br.machine(old)
    with pytest.raises(br.SchemaError, match="`kind`"):
        br.abcd_frame(old)


def test_migrated_records_read_through_the_one_schema():
    """The committed records of the former scripts, migrated to the harness's schema
    (once, by ``benchmarks/migrate_legacy_records.py``, gone since), give the same numbers as
    their own fields."""
    old = json.loads((ROOT / "results/kernels/run8/cub_311baa7/bench_NVIDIA_H200.json").read_text())
    lengths = old["metrics"]["lengths"]
    abcd = [{"L": x["L"], **x["abcd"]} for x in lengths if "abcd" in x]
    df = br.abcd_frame(old)
    assert len(df) == len(abcd) and bool(df["causal"].all())
    want = {r["L"]: r["A"] for r in abcd}
    assert {int(r.L): r.A for r in df.itertuples()} == want
    date = old["environment"]["time"]
    assert br.machine(old) == {"gpu": "NVIDIA H200", "git": "311baa7", "date": date}
    probe = json.loads((ROOT / "results/kernels/run8/step1_probe_07f2549.json").read_text())
    steps = br.step1_frame(probe)
    assert len(steps) == sum(r["scores"] == "default" for r in probe["metrics"]["by_L"])
    assert list(br.flash_frame(old)["flash_ms"]) == [x["full_ms"]["flash"] for x in lengths]
    base = json.loads((ROOT / "results/baselines/bench_baselines.json").read_text())
    with pytest.raises(br.SchemaError, match="not an ABCD record"):
        br.abcd_frame(base)


@pytest.mark.interpreter
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("L,S", [(128, 32), (100, 32), (20, 32)])
def test_abcd_identity_perms_hold_step1s_keys_in_token_order(L, S, causal):
    from benchmarks.abcd import identity_perms
    from s2o.kernels import s2o_step1

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, L, 16, generator=g), torch.randn(1, 1, L, 16, generator=g)
    _, ranked = s2o_step1(q, k, segment_len=S, causal=causal)
    qp, ident = identity_perms(1, 2, L, S, "cpu", causal)
    assert torch.equal(qp[0, 0], torch.arange(L))
    assert ident.shape == ranked.shape, (ident.shape, ranked.shape)
    assert torch.equal(ident.sort(-1).values, ranked.sort(-1).values)
    for row in ident.flatten(0, 2):
        keys = row[row >= 0]
        assert bool((keys[1:] > keys[:-1]).all()) and bool((row[len(keys) :] == -1).all()), row


def test_inputs_are_the_harness_data_configs():
    from benchmarks import common
    from eval.synthetic import SyntheticSpec

    conf = yaml.safe_load((ROOT / "conf/data/synthetic.yaml").read_text())
    spec = SyntheticSpec()
    for key, value in conf.items():
        if key not in ("source", "L", "heads_q", "heads_kv", "seed"):
            assert getattr(spec, key) == value, key  # --input synthetic = the defaults
    assert common.input_knobs("synthetic") == {}
    cal = common.input_knobs("calibrated")
    assert cal["sink"] == yaml.safe_load((ROOT / "conf/data/synthetic_calibrated.yaml")
                                         .read_text())["sink"] and "seed" not in cal  # fmt: skip
    with pytest.raises(ValueError, match="'simple'"):
        common.input_knobs("simple")


def test_benchmark_modules_import_no_circle():
    """The import graph of benchmarks/*.py has no cycle (and no file imports a removed probe)."""
    files = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__"}
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            deps |= {m.split(".")[1] for m in mods if m.startswith("benchmarks.")}
        assert not deps - set(files), f"{name} imports {deps - set(files)}"
        graph[name] = deps

    def visit(node, stack):
        assert node not in stack, f"import circle: {' -> '.join([*stack, node])}"
        for dep in graph[node]:
            visit(dep, [*stack, node])

    for name in graph:
        visit(name, [])


@pytest.mark.slow
def test_harness_paper_scale_smoke_runs_every_step(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("OUT", None)
    cmd = ["bash", "benchmarks/harness_paper_scale.sh", "--smoke", "testrev",
           f"results_dir={tmp_path}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    names = {p.parent.parent.name for p in (tmp_path / "experiments").glob("*/*/record.json")}
    assert names == {"hparams_tau", "component_ablation", "hparams_S", "fig4a_mse_vs_sparsity"}
    methods = {p.parent.parent.name for p in (tmp_path / "runs").glob("*/*/record.json")}
    assert {"s2o", "full", "flexprefill", "xattn", "pbs"} <= methods, methods


@pytest.mark.interpreter
def test_bench_tables_print_every_record(records, capsys):
    """``python -m analysis.bench_tables`` on the smoke records and on committed (migrated) old
    ones."""
    from analysis import bench_tables

    old = [ROOT / "results/kernels/run8/cub_311baa7/bench_NVIDIA_H200.json",
           ROOT / "results/baselines/bench_baselines.json",
           ROOT / "results/kernels/run8/step1_probe_07f2549.json"]  # fmt: skip
    new = [Path(r["_path"]) for r in records[0].values()]
    bench_tables.main([str(p) for p in old + new])
    text = capsys.readouterr().out
    assert text.count("\n## ") + text.startswith("## ") == len(old) + len(new)
    assert "| 131072 | 429.77 | 250.62 | 7.90 | 354.79 | 0.002 | 0.410 |" in text  # run8, cub
    assert "| 128 | False |" in text and "full_math" in text


def test_profile_prefill_configs_and_refusals():
    from benchmarks import profile_prefill as pp

    assert pp._configs("[s2o, {name: full, backend: cudnn}, {name: s2o, tau: 0.02}]") == [
        ("s2o", "s2o", {}),
        ("full_backendcudnn", "full", {"backend": "cudnn"}),
        ("s2o_tau0.02", "s2o", {"tau": 0.02}),
    ]
    for bad in ("[]", "[{tau: 0.1}]"):
        with pytest.raises(SystemExit):
            pp._configs(bad)
