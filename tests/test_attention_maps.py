"""experiments/attention_maps.py (the heatmap records of Fig. 2) end to end on a tiny synthetic
input: the record's files, its views, and numbers that must hold for any input."""

from __future__ import annotations

import json

import numpy as np

from experiments import attention_maps as am


def test_a_tiny_synthetic_record(tmp_path, capsys):
    out = tmp_path / "maps"
    am.main(["--synthetic", "conf/data/synthetic.yaml", "--synthetic-heads", "2", "1", "16",
             "--L", "256", "--S", "64", "--heads", "0", "1", "--pixels", "16", "--tile", "16",
             "--rev", "feedc0de", "--out", str(out)])  # fmt: skip
    rec = json.loads(out.with_suffix(".json").read_text())
    maps = np.load(out.with_suffix(".npz"))
    assert [e["key"] for e in rec["entries"]] == ["layer0_head0", "layer0_head1"]
    assert rec["command"].startswith("python -m experiments.attention_maps --synthetic")
    assert rec["git_revision"] and rec["input"]["L"] == 256
    for e in rec["entries"]:
        assert 0.0 < e["prefix_mass"] < 1.0
        for view in am.VIEWS:
            m = maps[f"{e['key']}/{view}"]
            assert m.shape == (16, 16) and m.dtype == np.uint8
            # causal: the cell above the diagonal is masked in the unpermuted view
            if view == "original":
                assert m[0, -1] == am.MASKED and m[-1, 0] != am.MASKED
            fr = e["tiles_for_mass"][view]
            assert 0.0 < fr["0.9"] <= fr["0.99"] <= 1.0, fr


def test_the_record_is_written_through_records_with_provenance(tmp_path, monkeypatch):
    """The JSON goes through ``experiments.records.write_record`` (atomic), after the maps (also
    replaced atomically: no temporary file left), with the revision and environment of
    ``experiments.provenance``."""
    from experiments import records

    written = []

    def spy(path, record):
        assert path.with_suffix(".npz").is_file(), "the record was written before its maps"
        written.append(path)
        records.write_record(path, record)

    monkeypatch.setattr(am, "write_record", spy)
    out = tmp_path / "maps"
    am.main(["--synthetic", "conf/data/synthetic.yaml", "--synthetic-heads", "1", "1", "16",
             "--L", "128", "--S", "64", "--pixels", "8", "--tile", "16",
             "--rev", "feedc0de", "--out", str(out)])  # fmt: skip
    assert written == [out.with_suffix(".json")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps.json", "maps.npz"]
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["git_revision"] == "feedc0de" == rec["environment"]["git_revision"]
    assert rec["environment"]["device"] == "cpu" and rec["maps"] == "maps.npz"
