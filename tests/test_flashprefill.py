"""FlashPrefill on the CPU: the reference selection against a per-tile loop written from the
official code's description (float64, no shared code), the method's behaviour, its knobs, and
the run configuration (per-family alpha, ``python run.py method=flashprefill``)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import s2o
import s2o.methods
from s2o.methods import flashprefill as fp
from s2o.methods.full import full_attention

ROOT = Path(__file__).resolve().parents[1]
RULE = dict(sink_blocks=2, local_blocks=4, dense_tail_tiles=2)


def _qkv(B, Hq, Hkv, L, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g) * 1.5
    k = torch.randn(B, Hkv, L, D, generator=g)
    k[:, :, 5] += 2.0 * q.mean((1, 2))[:, None]  # a heavy key: its block scores high in most rows
    v = torch.randn(B, Hkv, L, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _plain(q, k, *, bs, alpha, sink, local, tail, min_budget=0):
    """Per (b, h, query tile): loop over rows and blocks -> (sets, scores)."""
    B, Hq, L, D = q.shape
    G = Hq // k.shape[1]
    nb = math.ceil(L / bs)
    sets, scores = {}, torch.zeros(B, Hq, nb, nb, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kk = k[b, h // G].double()
            means = [kk[j * bs : (j + 1) * bs].mean(0).to(q.dtype).double() for j in range(nb)]
            for t in range(nb):
                logits = {}  # (row, block) -> logit; rows past L are zero vectors
                for i in range(t * bs, (t + 1) * bs):
                    qi = q[b, h, i].double() if i < L else torch.zeros(D, dtype=torch.float64)
                    for j in range(t + 1):
                        if i >= (j + 1) * bs - 1:
                            logits[i, j] = float(qi @ means[j]) / math.sqrt(D)
                m = max(logits.values())
                raw = [sum(math.exp(x - m) for (i, j), x in logits.items() if j == c)
                       for c in range(nb)]  # fmt: skip
                tot = sum(raw) + 1e-9
                row = [x / tot for x in raw]
                scores[b, h, t] = torch.tensor(row)
                keep = {j for j in range(t + 1) if row[j] >= alpha * max(row)}
                if min_budget:
                    order = sorted(range(nb), key=lambda j: (-row[j], j))[:min_budget]
                    keep |= {j for j in order if j <= t}
                keep |= {j for j in range(t + 1) if j < sink or t - j < local or t >= nb - tail}
                sets[b, h, t] = keep
    return sets, scores


def _sets(mask):
    B, H, nb, _ = mask.shape
    return {(b, h, t): set(mask[b, h, t].nonzero().flatten().tolist())
            for b in range(B) for h in range(H) for t in range(nb)}  # fmt: skip


def _unambiguous(scores, alpha, margin=1e-4):
    """Blocks whose score is not within ``margin`` (relative) of the threshold: decisions there
    cannot flip with the order of a float sum."""
    thr = alpha * scores.amax(-1, keepdim=True)
    return (scores - thr).abs() > margin * thr


CASES = [  # B, Hq, Hkv, L, D, bs: GQA 1/4/6, batch > 1, lengths not a multiple of the block
    (2, 2, 2, 300, 16, 32),
    (1, 4, 1, 300, 32, 16),
    (2, 6, 1, 1000, 16, 64),
    (1, 8, 2, 256, 16, 32),
]


@pytest.mark.parametrize("B,Hq,Hkv,L,D,bs", CASES)
@pytest.mark.parametrize("alpha", [0.05, 0.3])
def test_reference_equals_per_tile_loop(B, Hq, Hkv, L, D, bs, alpha):
    q, k, _ = _qkv(B, Hq, Hkv, L, D, seed=L + Hq)
    sets, plain = _plain(q, k, bs=bs, alpha=alpha, sink=2, local=4, tail=2)
    ours = fp.tile_scores(q, k, block_size=bs, scale=D**-0.5)
    err = float((ours.double() - plain).abs().max())
    assert err < 1e-5, f"normalized scores differ by {err:.3e}"
    plan = fp.flashprefill_plan(q, k, alpha=alpha, block_size=bs, min_budget=0, scale=None, **RULE)
    ok = _unambiguous(plain, alpha)
    got = _sets(plan.mask & ok)
    assert got == {key: {j for j in s if ok[key][j]} for key, s in sets.items()}
    assert bool((plan.mask == plan.mask.tril()).all()), "a block above the diagonal"


def test_min_budget_and_forced_blocks_equal_per_tile_loop():
    q, k, _ = _qkv(1, 4, 2, 700, 16, seed=3)
    for knobs in (dict(sink=0, local=1, tail=0, min_budget=3), dict(sink=3, local=2, tail=1)):
        mb = knobs.pop("min_budget", 0)
        sets, plain = _plain(q, k, bs=32, alpha=0.5, min_budget=mb, **knobs)
        plan = fp.flashprefill_plan(
            q, k, alpha=0.5, block_size=32, min_budget=mb, scale=None, sink_blocks=knobs["sink"],
            local_blocks=knobs["local"], dense_tail_tiles=knobs["tail"],
        )  # fmt: skip
        ok = _unambiguous(plain, 0.5)
        assert _sets(plan.mask & ok) == {
            key: {j for j in s if ok[key][j]} for key, s in sets.items()
        }


def test_forced_blocks_and_dense_tail():
    q, k, _ = _qkv(1, 2, 1, 1000, 16, seed=4)
    nb = math.ceil(1000 / 32)
    plan = fp.flashprefill_plan(q, k, alpha=1.0, block_size=32, min_budget=0, scale=None, **RULE)
    m = plan.mask[0, 0]
    assert bool(m[-2:].equal(fp.block_causal(nb, q.device)[-2:])), "last 2 tiles not dense"
    for t in range(nb - 2):
        forced = {j for j in range(t + 1) if j < 2 or t - j < 4}
        got = set(m[t].nonzero().flatten().tolist())
        assert forced <= got and len(got - forced) <= 1, (t, got)  # alpha=1: the best block only


def test_alpha_zero_equals_dense_causal_attention():
    q, k, v = _qkv(2, 4, 2, 301, 32, seed=5)
    out, stats = s2o.sparse_attention("flashprefill", q, k, v, alpha=0.0, block_size=32)
    err = float((out - full_attention(q, k, v, backend="math")).norm() / out.norm())
    assert err < 1e-5 and stats.sparsity == 0.0, (err, stats.sparsity)


def test_alpha_moves_sparsity_and_nests():
    q, k, v = _qkv(1, 4, 2, 2048, 32, seed=6)
    m = s2o.METHODS["flashprefill"]
    alphas = (0.95, 0.99)  # random inputs: pooled scores are near-uniform, only large alphas cut
    plans = [m.estimate(q, k, v, **{**m.defaults, "block_size": 64, "alpha": a}) for a in alphas]
    d = [float(p.mask.double().mean()) for p in plans]
    assert d[1] < d[0], f"density {d} for alpha {alphas}"
    assert m.sparsity_increases_with_knob and m.main_knob == "alpha"
    assert bool((plans[1].mask <= plans[0].mask).all()), "sparser mask not a subset"


@pytest.mark.parametrize(
    "knobs, match",
    [
        ({}, r"alpha is required"),
        (dict(alpha=1.5), r"alpha must be in \[0, 1\].*1\.5"),
        (dict(alpha=float("nan")), r"alpha must be a finite number"),
        (dict(alpha="0.1"), r"alpha must be a finite number.*'0\.1'"),
        (dict(alpha=0.1, block_size=48), r"block_size=48 must be a power of two"),
        (dict(alpha=0.1, sink_blocks=-1), r"sink_blocks must be an int >= 0, got -1"),
        (dict(alpha=0.1, local_blocks=0), r"local_blocks must be an int >= 1, got 0"),
        (dict(alpha=0.1, dense_tail_tiles=1.5), r"dense_tail_tiles must be an int >= 0, got 1\.5"),
        (dict(alpha=0.1, min_budget=True), r"min_budget must be an int >= 0, got True"),
        (dict(alpha=0.1, scale=-1.0), r"scale"),
        (dict(alpha=0.1, impl="cuda"), r"impl='cuda' is not one of"),
        (dict(alpha=0.1, mean_correction="on"), r"mean_correction must be a bool, got 'on'"),
        (dict(alpha=0.1, dense_first_layers=-4), r"dense_first_layers must be an int >= 0"),
        (dict(alpha=0.1, use_mean_correction=True), r"unknown knob.*use_mean_correction.*valid"),
    ],
)
def test_knobs_are_validated_naming_the_value(knobs, match):
    with pytest.raises(ValueError, match=match):
        s2o.methods.bind("flashprefill", **knobs)


def test_official_alpha_per_family():
    assert fp.official_alpha("llama") == 0.18
    assert fp.official_alpha("qwen2") == 0.08
    assert fp.official_alpha("qwen3_moe") == 0.12
    with pytest.raises(ValueError, match=r"no alpha for model_type='gemma3_text'"):
        fp.official_alpha("gemma3_text")


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    import run  # registers the flashprefill_alpha resolver
    from experiments.common import resolved_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    return resolved_config(run.prepare(cfg), run.job_context(cfg))


@pytest.mark.parametrize(
    "model, alpha",
    [(None, 0.18), ("llama31_8b", 0.18), ("qwen25_coder_1p5b", 0.08), ("smollm2_135m", 0.18)],
)
def test_run_config_resolves_alpha_per_model_family(model, alpha):
    over = ["method=flashprefill"] + ([f"model={model}"] if model else [])
    resolved = _compose(over)
    assert resolved["method"]["alpha"] == alpha  # the resolved value enters the run's identity
    resolved = _compose(over + ["method.alpha=0.3"])
    assert resolved["method"]["alpha"] == 0.3


@pytest.mark.parametrize("model", ["gemma3_270m", "qwen3_8b"])
def test_run_config_refuses_a_family_without_official_alpha(model):
    with pytest.raises(ValueError, match=rf"model={model}: FlashPrefill publishes no alpha"):
        _compose(["method=flashprefill", f"model={model}"])
    assert _compose(["method=flashprefill", f"model={model}", "method.alpha=0.1"])


def test_run_py_method_flashprefill_runs_on_cpu(tmp_path):
    cmd = [sys.executable, "run.py", "method=flashprefill", "method.block_size=32", "data.L=2048",
           "data.heads_q=4", "data.heads_kv=1", "wandb.mode=disabled", f"results_dir={tmp_path}",
           "device=cpu", "timing.rep=1", "timing.warmup=0"]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = next(tmp_path.glob("runs/flashprefill/*/record.json"))
    import json

    r = json.loads(rec.read_text())
    assert r["status"] == "ok" and r["config"]["method"]["alpha"] == 0.18, r.get("error")
    # the synthetic data's pooled-key scores are near-uniform: alpha 0.18 keeps about every block
    assert 0 <= r["metrics"]["sparsity"] < 1 and r["metrics"]["mse"] < 1e-6, r["metrics"]


def test_run_py_refuses_gemma_without_alpha_in_one_line(tmp_path):
    cmd = [sys.executable, "run.py", "method=flashprefill", "model=gemma3_270m", "data=model",
           "wandb.mode=disabled", f"results_dir={tmp_path}"]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "FlashPrefill publishes no alpha for model_type='gemma3_text'" in p.stderr, p.stderr
