"""benchmarks.profile_decode on the CPU with random weights: one record, a row per batch size,
per-step and per-token times that agree, the profile's top host ops; bad arguments refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import profile_decode  # noqa: E402

pytestmark = pytest.mark.models


def test_a_record_with_one_row_per_batch(tmp_path):
    path = profile_decode.main([
        "--model", "smollm2_135m", "--weights", "random", "--length", "48", "--batches", "1,3",
        "--steps", "3", "--top", "5", "--device", "cpu", "--out", str(tmp_path),
    ])  # fmt: skip
    rec = json.loads(path.read_text())
    assert rec["status"] == "ok" and rec["benchmark"] == "profile_decode"
    assert path.parent.parent.name == "profile_decode" and rec["environment"]["device"] == "cpu"
    one, three = rec["metrics"]["rows"]
    assert (one["batch"], three["batch"]) == (1, 3) and one["steps"] == three["steps"] == 3
    assert three["decode_ms_per_token"] == pytest.approx(three["decode_ms_per_step"] / 3)
    assert three["tokens_per_s"] == pytest.approx(1e3 / three["decode_ms_per_token"])
    assert one["speedup_vs_batch1"] == pytest.approx(1.0)
    assert three["speedup_vs_batch1"] == pytest.approx(three["tokens_per_s"] / one["tokens_per_s"])
    assert 1 <= len(one["top_host_ops"]) <= 5 and one["top_gpu_kernels"] == []
    assert one["gpu_busy"] is None and one["top_host_ops"][0]["ms_per_step"] > 0
    assert rec["config"]["batches"] == [1, 3] and rec["config"]["method"] == "full"


@pytest.mark.parametrize("argv, message", [
    (["--batches", "1,x"], "comma-separated positive ints"),
    (["--batches", "0"], "comma-separated positive ints"),
    (["--steps", "0"], "must be >= 1"),
    (["--length", "40000"], "context"),
    (["--model", "nope"], r"--model 'nope': no conf/model/nope.yaml \(known: .*smollm2_135m"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_loading(argv, message, tmp_path):
    base = ["--model", "smollm2_135m", "--weights", "random", "--length", "16", "--device",
            "cpu", "--out", str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit, match=message):
        profile_decode.main(base + argv)
