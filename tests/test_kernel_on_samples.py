"""benchmarks/kernel_on_samples.py on the CPU: which samples it picks from two records, and its
per-layer comparison (the kernel under the Triton interpreter against the reference)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import kernel_on_samples as kos


def _record(folder, scores):
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(json.dumps({"status": "ok"}))
    lines = [{"id": f"ruler/niah_multikey_2/{n}/42/{i}", "length": n, "score": s}
             for (n, i), s in scores.items()]  # fmt: skip
    (folder / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder / "record.json"


def test_lost_ids_are_the_samples_the_other_record_answered_better_at_that_length(tmp_path):
    full = _record(tmp_path / "full", {(32768, 0): 1, (32768, 1): 1, (32768, 2): 0, (16384, 0): 1})
    s2o = _record(tmp_path / "s2o", {(32768, 0): 0, (32768, 1): 1, (32768, 2): 1, (16384, 0): 0})
    assert kos.lost_ids(s2o, full, 32768) == ["ruler/niah_multikey_2/32768/42/0"]
    assert kos.lost_ids(s2o, full, 16384) == ["ruler/niah_multikey_2/16384/42/0"]


@pytest.mark.interpreter
def test_compare_layer_finds_the_kernel_equal_to_the_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 256, 16, generator=g).half()
    k, v = (torch.randn(1, 2, 256, 16, generator=g).half() for _ in range(2))
    knobs = dict(segment_len=64, tau=0.0, block_m=16, block_n=16, local_window=0, q_perm=None,
                 variant="two_pass", stop_tile="keep")  # fmt: skip
    row = kos.compare_layer(q, k, v, knobs)
    assert row["rel_err"] < 2e-3 and row["rel_err_question_rows"] < 2e-3, row
    assert row["same_walk_share"] == 1.0 and row["same_tiles_processed"], row
    assert row["density_kernel"] == pytest.approx(row["density_reference"])


def test_bad_layers_are_refused_naming_the_value():
    assert kos.parse_layers("0,5,27") == [0, 5, 27]
    with pytest.raises(SystemExit, match="--layers '0,x'"):
        kos.parse_layers("0,x")
