"""The generator's existing knobs keep their tensors: new structures default to off.

The checksums were taken from eval/synthetic.py before the topic and drift structures were added
(git edcedb6), so a change that moves today's tensors by one bit fails here. The second spec is
the calibrated knob set of that revision (conf/data/synthetic_calibrated.yaml at edcedb6)."""

import hashlib

import pytest
import torch

from eval.synthetic import SyntheticSpec, synthetic_qkv

OLD_CALIBRATED = dict(background=0.2059, sink=10.9065, heavy=0.1, slash=9.0686, horizontal=0.051)
PINNED = [
    (
        dict(L=300, heads_q=4, heads_kv=2, head_dim=32, seed=3, n_slash=2),
        ["fe141e5e6784b260", "e96b4e48e04f2ef5", "1b4f48667f1906b4"],
        ["8620490d2780307b", "56f8d17cee56a499", "b4d4bcb82623f26d"],
    ),
    (
        dict(L=257, heads_q=2, heads_kv=1, head_dim=64, seed=0, **OLD_CALIBRATED),
        ["1c8a210c2433c632", "8b6c828936e697a7", "c3b79fa799503093"],
        ["7b759c96974b6ad7", "95252630424a9c69", "879c954201973d25"],
    ),
]


def _digests(tensors) -> list[str]:
    return [hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16] for t in tensors]


@pytest.mark.parametrize("kw,want64,want32", PINNED)
def test_default_knobs_reproduce_the_pinned_tensors(kw, want64, want32):
    spec = SyntheticSpec(**kw)
    got64 = _digests(synthetic_qkv(spec, dtype=torch.float64))
    got32 = _digests(synthetic_qkv(spec))
    assert got64 == want64, f"float64 q/k/v digests {got64} != pinned {want64} for {kw}"
    assert got32 == want32, f"float32 q/k/v digests {got32} != pinned {want32} for {kw}"


def test_new_structures_leave_the_others_unchanged():
    """Topics, drift and head_temp draw from their own generator: V is the same tensor, and with
    topics alone only the keys that carry a topic (about ``topic_frac`` of them) move."""
    base = dict(L=600, heads_q=4, heads_kv=2, head_dim=32, seed=5)
    q0, k0, v0 = synthetic_qkv(SyntheticSpec(**base), dtype=torch.float64)
    topics = SyntheticSpec(**base, topics=3.0, topic_frac=0.2)
    q1, k1, v1 = synthetic_qkv(topics, dtype=torch.float64)
    _, _, v2 = synthetic_qkv(
        SyntheticSpec(**base, topics=3.0, drift=4.0, head_temp=0.5), dtype=torch.float64
    )
    assert torch.equal(v0, v1) and torch.equal(v0, v2)
    moved = (k1 != k0).any(dim=-1).double().mean().item()
    assert 0.1 < moved < 0.3, f"share of keys moved by topics {moved:.3f}, topic_frac 0.2"
    assert (q1 != q0).any(dim=-1).all(), "every query carries its region's topic"
