"""Step 1's Triton ranking (sample-splitter buckets + bitonic sorts) against ``torch.sort`` under
TRITON_INTERPRET=1: the same stable descending order, ties included, on the same fp32 scores."""

import pytest
import torch

from s2o.kernels.s2o_rank import rank_prefix_chunk

pytestmark = pytest.mark.interpreter


def _scores(BH, nc, width, gen):
    """Small integers (many ties) plus the values whose bit patterns need care."""
    s = torch.randint(-6, 7, (BH, nc, width), generator=gen).float()
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), -0.0, 1e-30, -1e-30])
    s.view(-1)[:: max(1, s.numel() // 40)][: len(special)] = special[: min(40, s.numel())][:7]
    return s


def _expected(scores, N, n0, S, W, p_max, marker):
    BH, nc, _ = scores.shape
    want = torch.full((BH, N, p_max), marker, dtype=torch.long)
    for j in range(nc):
        P = max(0, (n0 + j) * S - W)
        want[:, n0 + j] = -1
        order = torch.sort(scores[:, j, :P], dim=-1, descending=True, stable=True).indices
        want[:, n0 + j, :P] = order
    return want


@pytest.mark.parametrize(
    "cap,spb,overflow,dtype",
    [
        (16, 2, None, torch.int64),  # several buckets per row; overflow possible
        (16, 2, None, torch.int32),
        (8, 1, True, torch.int64),  # one sample per bucket: buckets overflow, the streaming path
        (4096, 64, False, torch.int64),  # the defaults: one bucket (cap 256) per row here
    ],
)
def test_rank_equals_stable_descending_argsort(cap, spb, overflow, dtype, gen):
    BH, N, S, W, n0, nc = 2, 6, 24, 5, 2, 4
    p_max = (N - 1) * S - W
    width = (n0 + nc - 1) * S - W
    scores = _scores(BH, nc, width, gen)
    kv_perm = torch.full((BH, N, p_max), -7, dtype=dtype)  # rows outside the chunk stay -7
    cnt = rank_prefix_chunk(
        scores, kv_perm, first_segment=n0, segment_len=S, local_window=W,
        config=dict(cap=cap, samples_per_bucket=spb),
    )  # fmt: skip
    if overflow is not None:
        assert bool((cnt > cap).any()) == overflow, cnt
    want = _expected(scores, N, n0, S, W, p_max, -7)
    got = kv_perm.long()
    assert torch.equal(got, want), f"differs at {(got != want).nonzero()[:5].tolist()}"


def test_rank_rejects_bad_config():
    scores = torch.zeros(1, 1, 8)
    with pytest.raises(ValueError, match="cap"):
        rank_prefix_chunk(scores, torch.empty(1, 2, 8, dtype=torch.long), first_segment=1,
                          segment_len=8, local_window=0, config=dict(cap=8, samples_per_bucket=4))  # fmt: skip
