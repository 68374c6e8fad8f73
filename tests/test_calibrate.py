"""eval/calibrate.py: the generator's statistics pooled over several draws (the fit's objective)."""

import pytest


def test_synthetic_stats_pool_the_heads_of_several_draws():
    """One seed gives that draw's medians over heads; several pool their heads, each draw a
    "layer": every median lies between the draws' own, and ``head_spread`` is the median over
    draws (of two: the lower)."""
    from eval.calibrate import STATS, layer_stats, median_stats, synthetic_stats
    from eval.synthetic import SyntheticSpec, synthetic_qkv

    knobs = {"topics": 3.0, "topic_frac": 0.1, "drift": 4.0, "drift_len": 100.0, "head_temp": 0.3}
    shape = dict(L=1536, heads_q=3, heads_kv=1, head_dim=64)
    one = {}
    for seed in (0, 1):
        q, k, _ = synthetic_qkv(SyntheticSpec(seed=seed, **shape, **knobs))
        one[seed] = median_stats(layer_stats(q, k))
        assert synthetic_stats(knobs, 1536, 3, 1, 64, (seed,)) == one[seed]
    assert one[0] != one[1]  # the draws differ, or pooling them would test nothing
    both = synthetic_stats(knobs, 1536, 3, 1, 64, (0, 1))
    assert set(both) == set(STATS)
    for s in STATS:
        lo, hi = sorted((one[0][s], one[1][s]))
        assert lo - 1e-9 <= both[s] <= hi + 1e-9, (s, both[s], lo, hi)
    # head_spread: the median over the two draws (torch's median: the lower of the two)
    assert both["head_spread"] == pytest.approx(min(one[0]["head_spread"], one[1]["head_spread"]))
    with pytest.raises(ValueError, match="seeds"):
        synthetic_stats(knobs, 1536, 3, 1, 64, ())


def test_topic_balance_deals_every_topic_the_same_number_of_regions(tmp_path):
    """topic_balance: per draw every topic has the same number of regions (+-1), in an order that
    changes with the seed; the tensors change only through the regions; a fit's conf/data file
    names the switch only when the fit set it."""
    import torch

    from eval.calibrate import write_conf
    from eval.synthetic import SyntheticSpec, _regions, synthetic_qkv

    orders = []
    for seed in (0, 1):
        spec = SyntheticSpec(L=4096, topic_span=228, n_topics=8, topic_balance=True, seed=seed)
        regions = _regions(spec, torch.Generator().manual_seed(seed))
        counts = torch.bincount(regions, minlength=8)
        assert len(regions) == 18 and int(counts.max() - counts.min()) <= 1, counts
        orders.append(regions)
    assert not torch.equal(*orders)
    free = _regions(SyntheticSpec(L=4096, topic_span=228), torch.Generator().manual_seed(3))
    assert int(torch.bincount(free, minlength=8).max()) > 3  # independent draws pile up
    kw = dict(L=1024, heads_q=2, heads_kv=1, head_dim=32, topics=3.0)
    q0, k0, v0 = synthetic_qkv(SyntheticSpec(**kw))
    q1, k1, v1 = synthetic_qkv(SyntheticSpec(topic_balance=True, **kw))
    assert torch.equal(v0, v1) and not torch.equal(k0, k1)
    meta = dict(command="-", git="-", record="-", source="-", L=4096, D=64, knobs="-")
    write_conf(tmp_path / "on.yaml", {"sink": 9.0, "topic_balance": True}, meta)
    write_conf(tmp_path / "off.yaml", {"sink": 9.0}, meta)
    assert "topic_balance: true" in (tmp_path / "on.yaml").read_text()
    assert "topic_balance" not in (tmp_path / "off.yaml").read_text()


def test_the_fit_record_is_written_through_records_with_provenance_and_rules(tmp_path, monkeypatch):
    """experiments/calibration_fit.py writes its record with ``experiments.records.write_record``
    (atomic: no temporary file left), stamps the revision and environment from
    ``experiments.provenance``, and records the rules its readers need (the statistics fitted and
    the knobs' bounds), so analysis/calibration_check.py reads them from the record."""
    import json

    from eval.calibrate import BOUNDS, STATS
    from experiments import calibration_fit, records

    written = []

    def spy(path, record):
        written.append(path)
        records.write_record(path, record)

    monkeypatch.setattr(calibration_fit, "write_record", spy)
    path = tmp_path / "fit" / "record.json"
    out = ["--rev", "feedc0de", "--out", str(tmp_path / "c.yaml"), "--record", str(path)]
    rec = calibration_fit.main(["--synthetic-target", "--L", "1536", "--fit-heads", "2", "1",
                                "--fit-seeds", "100", "--report-seeds", "0", "--max-evals", "3",
                                *out])  # fmt: skip
    assert written == [path]
    assert json.loads(path.read_text()) == json.loads(json.dumps(rec))
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]
    assert rec["git_revision"] == "feedc0de" == rec["environment"]["git_revision"]
    assert rec["environment"]["device"] == "cpu" and rec["environment"]["torch"]
    assert rec["stats"] == list(STATS)
    assert rec["bounds"] == {k: list(v) for k, v in BOUNDS.items()}
    assert rec["command"].startswith("python -m experiments.calibration_fit --synthetic-target")
    assert "at git feedc0de" in (tmp_path / "c.yaml").read_text()
