"""analysis/ttft_matched.py: S2O against FlashPrefill at matched density, on hand-made kind=e2e
records (the interpolation, its refusal to extrapolate, families split by their other knobs, the
missing pin), and the labels experiments/e2e.py gives the sweep it prints as its command."""

from __future__ import annotations

import json
import shlex

import pytest
from harness_util import compose, run_inprocess

from analysis import ttft_matched as tm
from analysis.sections import Ctx


def _point(label: str, density: float, ms: float, knobs: dict | None = None, L: int = 8) -> dict:
    row = {"label": label, "L": L, "method": label.split("_")[0], "density": density,
           "total_ms": ms, "estimate_ms": ms / 10, "sparse_attention_ms": ms / 2}  # fmt: skip
    return row if knobs is None else row | {"knobs": knobs}


DENSE = [
    {"label": "full_flash", "L": 8, "method": "full", "density": 1.0, "total_ms": 400.0,
     "sparse_attention_ms": 200.0},
    {"label": "full_cudnn", "L": 8, "method": "full", "density": 1.0, "total_ms": 300.0,
     "sparse_attention_ms": 100.0},
]  # fmt: skip


def _record(rows: list[dict], methods: list | None = None, rid: str = "r1") -> dict:
    env = {"device": "cuda", "device_name": "H100", "gpu_processes": 1, "git_revision": "abc1234"}
    return {"status": "ok", "id": rid, "environment": env, "metrics": {"rows": rows},
            "config": {"e2e": {"methods": methods or []}}}  # fmt: skip


def test_bracket_matches_exactly_interpolates_and_never_extrapolates():
    d = [0.3, 0.1, 0.2]  # in any order
    assert tm.bracket(d, 0.2) == [(2, 1.0)]
    assert tm.bracket(d, 0.1) == [(1, 1.0)] and tm.bracket(d, 0.3) == [(0, 1.0)]
    (lo, w_lo), (hi, w_hi) = tm.bracket(d, 0.125)
    assert (lo, hi) == (1, 2) and w_lo == pytest.approx(0.75) and w_hi == pytest.approx(0.25)
    assert (
        tm.bracket(d, 0.05) is None and tm.bracket(d, 0.31) is None and tm.bracket([], 0.1) is None
    )
    assert tm.bracket([0.1, 0.1, 0.2], 0.1) == [(0, 0.5), (1, 0.5)]  # two runs at one density


def test_matched_rows_compare_each_point_at_the_others_density():
    s2o = [_point("s2o", 0.1, 100.0), _point("s2o_tau0.02", 0.2, 140.0)]
    fp = [_point("flashprefill_alpha0.05", 0.1, 110.0),
          _point("flashprefill_alpha0.08", 0.15, 120.0),
          _point("flashprefill_alpha0.2", 0.3, 160.0)]  # fmt: skip
    rows = {r["measured"]: r for r in tm.matched_rows(s2o, fp, {r["label"]: r for r in DENSE})}
    # the shared density is listed once, from S2O's side, both sides measured
    assert set(rows) == {"s2o", "s2o_tau0.02", "flashprefill_alpha0.08", "flashprefill_alpha0.2"}
    exact = rows["s2o"]
    assert exact["match"] == "both measured" and exact["FlashPrefill ms"] == 110.0
    assert exact["S2O / FlashPrefill"] == pytest.approx(100 / 110)
    # S2O's point at .2: FlashPrefill between .15 and .3, a third of the way
    r = rows["s2o_tau0.02"]
    assert r["match"] == "FlashPrefill interpolated"
    assert r["FlashPrefill ms"] == pytest.approx(120 + 40 / 3)
    assert r["S2O estimate ms"] == 14.0 and r["S2O sparse attn ms"] == 70.0
    assert r["S2O vs flash"] == pytest.approx(400 / 140)
    assert r["FlashPrefill vs cudnn"] == pytest.approx(300 / (120 + 40 / 3))
    assert r["S2O share of bound"] == pytest.approx((300 - 100 + 0.2 * 100) / 140)
    # FlashPrefill's point at .15: S2O halfway, its breakdown with the same weights
    r = rows["flashprefill_alpha0.08"]
    assert r["match"] == "S2O interpolated" and r["side"] == "flashprefill"
    assert r["S2O ms"] == pytest.approx(120.0) and r["S2O / FlashPrefill"] == pytest.approx(1.0)
    assert r["S2O estimate ms"] == pytest.approx(12.0)
    assert r["S2O sparse attn ms"] == pytest.approx(60.0)
    # beyond S2O's densest point: no S2O number, the range it had instead
    r = rows["flashprefill_alpha0.2"]
    assert r["match"] == "outside S2O's densities (0.100 to 0.200)"
    assert "S2O ms" not in r and "S2O / FlashPrefill" not in r and r["FlashPrefill ms"] == 160.0


def test_families_split_by_every_knob_but_the_swept_one():
    base = {"tau": 0.005, "step1_sort": "chunks", "segment_len": 2048}
    rows = DENSE + [
        _point("s2o", 0.2, 100.0, base),
        _point("s2o_tau0.02", 0.1, 90.0, base | {"tau": 0.02}),
        _point("s2o_step1_sortcub_tau0.02", 0.1, 80.0, base | {"tau": 0.02, "step1_sort": "cub"}),
        _point("flashprefill_alpha0.05", 0.2, 120.0, {"alpha": 0.05, "block_size": 128}),
        _point("flashprefill_alpha0.1", 0.1, 100.0, {"alpha": 0.1, "block_size": 128}),
    ]  # fmt: skip
    rec = _record(rows)
    fams = tm.families(rec)[8]
    assert sorted(len(v) for v in fams.values()) == [1, 2, 2]
    assert sorted(tm.family_names(rec).values()) == ["flashprefill", "s2o", "s2o step1_sort=cub"]
    df = tm.matched_frame([rec])
    assert set(df["S2O"]) == {"s2o", "s2o step1_sort=cub"}
    cub = df[df["S2O"] == "s2o step1_sort=cub"].set_index("measured")
    assert cub.loc["s2o_step1_sortcub_tau0.02", "S2O / FlashPrefill"] == pytest.approx(0.8)
    assert cub.loc["flashprefill_alpha0.05", "match"] == "outside S2O's one density (0.100)"
    text = tm.verdicts(df)
    assert "8, s2o against flashprefill: S2O is faster" in text[0]
    assert "at every matched density (2 points, S2O / FlashPrefill 0.83 to 0.90)" in text[0]
    assert text[-1].endswith("open, no matched point at 32K, 64K, 128K.")


def test_families_are_named_by_what_differs_from_the_methods_defaults():
    """The family holding the method's own row (label ``s2o``) is the base; the others name the
    knobs they change, a mapping flattened; without a base row every knob that varies is named."""
    base = {"tau": 0.005, "step1_sort": "chunks", "launch": None}
    walk = {"pass2": {"walk": "triton"}}
    rows = DENSE + [
        _point("s2o", 0.2, 100.0, base),
        _point("s2o_tau0.02", 0.1, 90.0, base | {"tau": 0.02}),
        _point("s2o_launch_tau0.02", 0.1, 95.0, base | {"tau": 0.02, "launch": walk}),
        _point("s2o_cub_tau0.02", 0.1, 80.0, base | {"tau": 0.02, "step1_sort": "cub"}),
    ]  # fmt: skip
    names = sorted(tm.family_names(_record(rows)).values())
    assert names == ["s2o", "s2o launch.pass2.walk=triton", "s2o step1_sort=cub"]
    no_base = sorted(tm.family_names(_record(DENSE + rows[-2:])).values())
    assert no_base == [
        "s2o launch.pass2.walk=triton step1_sort=chunks",
        "s2o launch=None step1_sort=cub",
    ]


def test_records_without_row_knobs_take_them_from_their_entries():
    """Before rows kept ``knobs``: an entry's label gives its knobs, the job's own method none."""
    methods = [{"name": "s2o", "tau": 0.02}, {"name": "s2o", "tau": 0.02, "step1_sort": "cub"},
               "flashprefill", {"name": "flashprefill", "alpha": 0.2}]  # fmt: skip
    rows = DENSE + [
        _point("s2o", 0.2, 100.0), _point("s2o_tau0.02", 0.1, 90.0),
        _point("s2o_step1_sortcub_tau0.02", 0.1, 80.0), _point("flashprefill", 0.2, 120.0),
        _point("flashprefill_alpha0.2", 0.1, 99.0),
    ]  # fmt: skip
    names = tm.family_names(_record(rows, methods))
    assert sorted(names.values()) == ["flashprefill", "s2o", "s2o step1_sort=cub"]
    assert sorted(len(v) for v in tm.families(_record(rows, methods))[8].values()) == [1, 2, 2]


def test_families_without_a_shared_density_range_say_so():
    rows = DENSE + [
        _point("s2o", 0.05, 80.0), _point("s2o_tau0.02", 0.07, 90.0),
        _point("flashprefill", 0.1, 100.0, None, 131072), _point("flashprefill", 0.1, 100.0),
    ]  # fmt: skip
    text = tm.verdicts(tm.matched_frame([_record(rows)]))
    assert text == [
        "8, s2o against flashprefill: no density where both were measured (S2O at densities "
        "(0.050 to 0.070), FlashPrefill at one density (0.100)): no comparison at matched density.",
        "Target (S2O, the paper's method without a named variant, faster than FlashPrefill at "
        "matched density at 32K, 64K, 128K): open, no matched point at 32K, 64K, 128K.",
    ]


def test_the_target_holds_where_s2o_is_faster_at_every_matched_density_of_every_length():
    def target(fp_ms_at_128k: float) -> str:
        fp = {L: 100.0 for L in tm.TARGET_LENGTHS} | {131072: fp_ms_at_128k}
        rows = [_point("s2o", 0.1, 90.0, None, L) for L in fp]
        rows += [_point("flashprefill", 0.1, ms, None, L) for L, ms in fp.items()]
        return tm.verdicts(tm.matched_frame([_record(rows)]))[-1]

    assert target(100.0).endswith("32K, 64K, 128K): met at every one.")
    assert target(80.0).endswith("32K, 64K, 128K): missed at 128K.")


def test_a_named_variant_faster_everywhere_does_not_meet_the_target():
    """step1_score_bits=16 departs from the paper's ranking: its family gets its sentences, but
    the target counts only the paper's method (the default, or knobs that keep its results)."""
    variant = {"tau": 0.005, "step1_sort": "cub", "step1_score_bits": 16}
    rows = []
    for L in tm.TARGET_LENGTHS:
        rows += [_point("s2o", 0.1, 110.0, {"tau": 0.005}, L),
                 _point("s2o_step1_score_bits16", 0.1, 90.0, variant, L),
                 _point("flashprefill", 0.1, 100.0, {"alpha": 0.08}, L)]  # fmt: skip
    text = tm.verdicts(tm.matched_frame([_record(rows)]))
    assert any(t.startswith("32K, s2o step1_score_bits=16 step1_sort=cub against flashprefill: "
                            "S2O is faster") for t in text), text  # fmt: skip
    assert text[-1].endswith("32K, 64K, 128K): missed at 32K, 64K, 128K."), text[-1]


def _ctx(tmp_path, pins: list[str] | None, records: dict[str, dict] | None = None) -> Ctx:
    results = tmp_path / "results"
    for rel, rec in (records or {}).items():
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text(json.dumps(rec))
    manifest = {"records": {"ttft_matched": {"qwen25_coder_1p5b": pins}}} if pins else {}
    return Ctx(results, tmp_path / "out", manifest, {})


def test_a_missing_pin_gives_the_command_and_a_pinned_record_the_page(tmp_path):
    sec = tm.section(_ctx(tmp_path, None))
    assert not sec.files and not sec.sources and len(sec.missing) == 1
    assert "records.ttft_matched.qwen25_coder_1p5b" in sec.missing[0]
    for cmd in tm.COMMANDS:
        assert f"`{cmd}`" in sec.missing[0]
    sec = tm.section(_ctx(tmp_path, ["e2e/nowhere/record.json"]))
    assert "`results/e2e/nowhere/record.json` (pinned" in sec.missing[0] and not sec.files
    rows = DENSE + [
        _point("s2o", 0.1, 100.0), _point("s2o_tau0.02", 0.05, 90.0),
        _point("flashprefill", 0.08, 100.0), _point("flashprefill_alpha0.2", 0.12, 99.0),
    ]  # fmt: skip
    rel = "e2e/qwen25_coder_1p5b/s2o/r1/record.json"
    sec = tm.section(_ctx(tmp_path, [rel], {rel: _record(rows)}))
    assert sec.files == ["ttft_matched_qwen25.png"] and (tmp_path / "out" / sec.files[0]).is_file()
    assert sec.sources == [f"`results/{rel}` (H100, git abc1234)"] and not sec.missing
    page = "\n".join(sec.body)
    assert "| 8 | s2o | flashprefill | s2o | 0.100 | FlashPrefill interpolated |" in page
    assert "- 8, s2o against flashprefill: S2O is faster at 1 of 2 matched densities" in page


def test_the_printed_sweep_composes_into_distinct_labels_the_analysis_reads():
    """Each command the section prints composes; every configuration of its sweep has its own
    label, the one :func:`analysis.ttft_matched.entry_label` gives its entry."""
    from omegaconf import OmegaConf, open_dict

    from experiments.e2e import configurations

    for cmd in tm.COMMANDS:
        cfg = compose(shlex.split(cmd)[2:])
        with open_dict(cfg):
            del cfg["hydra"]
        resolved = OmegaConf.to_container(cfg, resolve=True)
        resolved["method_name"] = "s2o"
        labels = [c[0] for c in configurations(resolved)]
        assert len(labels) == len(set(labels)), labels
        entries = [e for e in resolved["e2e"]["methods"] if isinstance(e, dict)]
        assert {tm.entry_label(e) for e in entries} <= set(labels)
        assert sum(lab.startswith("s2o") for lab in labels) >= 4
        assert sum(lab.startswith("flashprefill") for lab in labels) >= 4


def test_a_configuration_given_twice_is_refused():
    from experiments.common import ConfigError
    from experiments.e2e import configurations

    twice = [{"name": "s2o", "tau": 0.02}, {"tau": 0.02, "name": "s2o"}]  # the same, reordered
    resolved = {"method_name": "s2o", "method": {}, "model": None,
                "e2e": {"dense": ["flash"], "stock": False, "methods": twice}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"\['s2o_tau0.02'\] given twice"):
        configurations(resolved)


def test_e2e_rows_keep_every_knob_they_ran_with(tmp_path):
    arch = ["model.arch.num_hidden_layers=2", "model.arch.num_attention_heads=4",
            "model.arch.num_key_value_heads=2", "model.arch.head_dim=32", "model.weights=random",
            "model.arch.vocab_size=500", "model.arch.hidden_size=288",
            "model.arch.intermediate_size=256"]  # fmt: skip
    rec = run_inprocess(
        ["kind=e2e", "model=llama31_8b", *arch, "e2e.lengths=[256]", "e2e.dense=[flash]",
         "e2e.stock=false", "e2e.methods=[{name:s2o,tau:0.05,step1_sort:full}]", "e2e.reps=1",
         "e2e.warmup=0", "method.segment_len=128", "method.block_m=32", "method.block_n=32",
         "device=cpu"],
        tmp_path,
    )  # fmt: skip
    assert rec["status"] == "ok", rec.get("traceback")
    rows = {r["label"]: r for r in rec["metrics"]["rows"]}
    assert set(rows) == {"full_flash", "s2o", "s2o_step1_sortfull_tau0.05"}
    assert rows["full_flash"]["knobs"]["backend"] == "flash"
    own = rows["s2o"]["knobs"]  # the job's method block, and any knob it leaves at its default
    assert all(own[k] == v for k, v in rec["config"]["method"].items())
    cub = rows["s2o_step1_sortfull_tau0.05"]["knobs"]
    assert cub["tau"] == 0.05 and cub["step1_sort"] == "full" and cub["segment_len"] == 2048
