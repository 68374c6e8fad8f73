"""hydra/sweeper=points: a union of sweeps in one multirun, and the accuracy experiment files
built on it (every job of each composes; the job lists are the ones their tables need)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from harness_util import compose, run_cli, run_inprocess
from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_plugins.s2o_sweepers.points import PointsSweeper, expand

T4 = "benchmark.tasks=[niah_single_1,niah_multikey_1,vt,fwe]"


def _jobs(points: list[str], command_line: list[str]) -> list[list[str]]:
    parser = OverridesParser.create()
    return expand(points, parser.parse_overrides(command_line), parser)


def test_points_are_a_union_of_sweeps_each_job_once():
    jobs = _jobs(["method=full,s2o", "method=s2o tau=0.1,0.2", "method=s2o tau=0.1"],
                 ["seed=1", "tau=0.5"])  # fmt: skip
    assert jobs == [
        ["seed=1", "tau=0.5", "method=full"],
        ["seed=1", "tau=0.5", "method=s2o"],
        ["seed=1", "method=s2o", "tau=0.1"],  # the point's tau wins over the command line's
        ["seed=1", "method=s2o", "tau=0.2"],
    ]
    # the command line's own sweeps multiply every point
    assert len(_jobs(["method=full", "method=s2o S=1,2"], ["seed=1,2"])) == 2 + 4


def test_points_must_be_strings_and_parse():
    with pytest.raises(ValueError, match=r"points: \['method=s2o'\] is not a string"):
        PointsSweeper(points=[["method=s2o"]])
    with pytest.raises(ValueError, match=r"points\[1\]='tau=\(': "):
        _jobs(["method=s2o", "tau=("], [])
    sweeper = PointsSweeper()  # no points: Hydra's basic sweeper, the product
    over = OverridesParser.create().parse_overrides(["a=1,2", "b=3,4"])
    assert len(sweeper.split_arguments(over, None)[0]) == 4


@pytest.mark.parametrize(
    "experiment,n_jobs",
    [("accuracy_smollm2_ruler_4k", 6 + 12 + 3 + 2 + 2 + 2),
     ("accuracy_gemma3_passkey_32k", 5 + 1 + 16 + 3 + 2 + 2 + 2),
     ("accuracy_gemma3_ruler", 5 + 1 + 12 + 2 + 2 + 2 + 2),
     ("accuracy_paper_ruler", 6), ("accuracy_paper_infinitebench", 6),
     ("accuracy_paper_longbench_v2", 6), ("accuracy_retrieval_qwen_niah", 4 + 2),
     ("accuracy_qwen_ruler", 6 + 6),
     ("accuracy_qwen_fronts", 1 + 6 + 4 + 2 + 5 + 4 + 4 + 5),
     ("accuracy_qwen_long", 6 + 6), ("accuracy_qwen_passkey_32k", 6),
     ("accuracy_small_rows", 5 + 1 + 6), ("accuracy_retrieval_gemma_niah", 3 + 2)],
)  # fmt: skip
def test_accuracy_experiments_compose_every_job(experiment, n_jobs):
    """Every job of the file composes (a knob that its method lacks would fail here), and the
    sweep rows run on the tasks named for them."""
    import run  # noqa: F401  (registers the flashprefill_alpha resolver)

    cfg = compose([f"experiment={experiment}"])
    jobs = _jobs(list(cfg.hydra.sweeper.points), [f"experiment={experiment}"])
    assert len(jobs) == n_jobs, jobs
    seen = set()
    for job in jobs:
        c = compose(job)
        # the small models' files measure each layer's error; the 8B files leave it off (a dense
        # pass per layer and sample at 128K), the retrieval diagnosis records evidence recall
        assert c.kind == "accuracy"
        off = experiment.startswith(("accuracy_paper_", "accuracy_retrieval_", "accuracy_qwen_"))
        assert c.benchmark.measure_error is not off
        method = c.hydra.runtime.choices.method
        keys = (
            "tau",
            "segment_len",
            "q_perm",
            "gamma",
            "threshold",
            "alpha",
            "dense_tail",
            "tail_rank",
        )
        knobs = {k: c.method.get(k) for k in keys}  # FlashPrefill's alpha resolves for the model
        if method == "flashprefill":
            assert 0 < knobs["alpha"] < 1, job
        seen.add(
            (
                method,
                *map(str, knobs.values()),
                tuple(c.benchmark.tasks),
                tuple(c.benchmark.get("lengths") or ()),
            )
        )
    assert len(seen) == n_jobs  # no two jobs are the same run


def test_one_command_runs_every_point(tmp_path):
    """`run.py -m` with points runs the union in one process: 4 operator jobs, each a record."""
    points = (
        'hydra.sweeper.points=["method=full,s2o","method=s2o tau=0.001,0.01",'
        '"method=s2o tau=0.001"]'
    )
    proc = run_cli(["-m", "hydra/sweeper=points", points, "dry_run=true", "timing.enabled=false"],
                   tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Launching 4 jobs" in proc.stdout + proc.stderr
    assert len(list((tmp_path / "runs").rglob("record.json"))) == 4


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or os.environ.get("S2O_NO_REAL_MODEL") == "1",
    reason="needs the realmodel extra (gguf)",
)
def test_accuracy_experiment_dry_run_scores_one_real_sample(tmp_path):
    """`python run.py experiment=accuracy_smollm2_ruler_4k dry_run=true`: its tiny block, one
    sample of niah_single_1 at 1K through the real SmolLM2 (from PyPI) on the CPU."""
    rec = run_inprocess(["experiment=accuracy_smollm2_ruler_4k", "dry_run=true"], tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    cells = rec["metrics"]["cells"]
    assert [(c["task"], c["length"], c["n"]) for c in cells] == [("niah_single_1", 1024, 1)]
    assert cells[0]["rel_mse"] is not None  # the file measures each layer's error
