"""Evidence recall (eval/evidence.py) and the methods' coverage (the keys each computed), on
synthetic inputs whose answer is known."""

import math
from pathlib import Path

import pytest
import torch

from eval.evidence import EvidenceProbe, dense_probs, locate
from s2o.methods import bind

SEG, BLOCK = 32, 16
KNOBS = {
    "full": {},
    "s2o": dict(segment_len=SEG, block_m=BLOCK, block_n=BLOCK, tau=0.3, impl="reference"),
    "flexprefill": dict(block_size=BLOCK, min_budget=32, gamma=0.5, impl="reference"),
    "flashprefill": dict(block_size=BLOCK, alpha=0.99, local_blocks=2, impl="reference"),
    "xattn": dict(block_size=BLOCK, stride=4, threshold=0.5, impl="reference"),
    "pbs": dict(block_size=BLOCK, segment_size=SEG, threshold=0.5, impl="reference"),
}


def _qkv(L=160, Hq=4, Hkv=2, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hq, L, D, generator=gen) * 1.5
    k = torch.randn(1, Hkv, L, D, generator=gen)
    v = torch.randn(1, Hkv, L, D, generator=gen)
    return q, k, v


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_coverage_reproduces_the_output(name):
    """Attention restricted to the keys ``coverage`` reports equals the method's own output for
    those rows: the coverage is the set of keys the method computed, no more, no less."""
    q, k, v = _qkv()
    bound = bind(name, **KNOBS[name])
    plan = bound.estimate(q, k, v)
    out, stats = bound.attend(q, k, v, plan)
    L = q.shape[2]
    rows = torch.tensor([0, 5, 40, 77, 100, 131, 150, L - 1])
    cov = bound.coverage(plan, stats, rows, L)
    assert cov.shape == (1, 4, len(rows), L) and cov.dtype == torch.bool
    assert not bool((cov & (torch.arange(L)[None, :] > rows[:, None])).any()), "future keys"
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = (q[:, :, rows].double() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    p = torch.softmax(s.masked_fill(~cov, float("-inf")), -1)
    want = p @ vv
    assert float((out[:, :, rows].double() - want).abs().max()) < 1e-4
    if name != "full":  # the test must be able to tell a sparse coverage from a dense one
        assert bool((~cov & (torch.arange(L)[None, :] <= rows[:, None])).any())


def _needle_case(L=192, D=16, pos=20, rows=(186, 187, 188, 189, 190, 191)):
    """Question rows that attend almost only to key ``pos`` (the needle), far in the prefix."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, L, D, generator=gen) * 0.3
    k = torch.randn(1, 1, L, D, generator=gen) * 0.3
    v = torch.randn(1, 1, L, D, generator=gen)
    direction = torch.randn(D, generator=gen)
    direction /= direction.norm()
    k[0, 0, pos] = 6 * direction
    for r in rows:
        q[0, :, r] = 6 * direction
    keys = torch.zeros(L, dtype=torch.bool)
    keys[pos] = True
    from eval.evidence import Evidence

    return q, k, v, Evidence(keys, torch.tensor(rows), [(pos, pos + 1)])


@pytest.mark.parametrize(
    "name,knobs,recall",
    [
        ("full", {}, 1.0),
        # local window and own segment only: the needle, in the ranked prefix, is never walked
        ("s2o", dict(KNOBS["s2o"], walk_budget=0), 0.0),
        # the question's tiles walk their whole prefix
        ("s2o", dict(KNOBS["s2o"], dense_tail=8), 1.0),
    ],
)
def test_probe_recall_on_a_known_needle(name, knobs, recall):
    q, k, v, ev = _needle_case()
    bound = bind(name, **knobs)
    plan = bound.estimate(q, k, v)
    _, stats = bound.attend(q, k, v, plan)
    probe = EvidenceProbe()
    probe.start(ev)
    probe(3, q, k, plan, stats, None, bound)
    out = probe.summary()
    assert out["layers"] == [3] and out["rows"] == 6 and out["evidence_tokens"] == 1
    assert min(out["mass"][0]) > 0.9  # the rows do read the needle
    assert out["evidence_recall"] == pytest.approx(recall, abs=1e-6)
    if name == "s2o":
        s2o = out["s2o"]
        assert set(s2o) == {"walk_share", "rank_segment_mean", "rank_question_mean"}
        assert s2o["rank_question_mean"][0] == [0.0, 0.0]  # the question ranks the needle first
        assert s2o["walk_share"][0] == ([0.0, 0.0] if recall == 0 else [1.0, 1.0])


def test_probe_is_silent_without_evidence_and_checks_length():
    q, k, v, ev = _needle_case()
    bound = bind("full")
    probe = EvidenceProbe()
    probe(0, q, k, None, bound.attend(q, k, v, None)[1], None, bound)
    assert probe.summary() is None
    short = type(ev)(ev.keys[:-1], ev.rows, ev.spans)
    probe.start(short)
    with pytest.raises(ValueError, match="located in 191 tokens, the prefill has 192"):
        probe(0, q, k, None, bound.attend(q, k, v, None)[1], None, bound)


def test_dense_probs_are_causal_softmax():
    q, k, _ = _qkv(L=40)
    rows = torch.tensor([3, 39])
    p = dense_probs(q, k, rows, 0.25)
    assert torch.allclose(p.sum(-1), torch.ones(1, 4, 2))
    assert float(p[0, :, 0, 4:].abs().max()) == 0.0


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


@pytest.mark.models
def test_locate_maps_strings_to_tokens():
    words = "hay more the number for red is 7 . what is it ? answer".split()
    tok = _word_tokenizer(words)
    prompt = "hay hay the number for red is 7 . more hay what is it ? answer"
    needle, question = "the number for red is 7 .", "what is it ?"
    ev = locate(tok, prompt, True, [needle], question)  # BOS first: token 0 is <s>
    assert ev.spans == [(3, 10)]
    assert ev.keys.nonzero().flatten().tolist() == list(range(3, 10))
    assert ev.rows.tolist() == [12, 13, 14, 15, 16]
    ev = locate(tok, prompt, False, [needle], question)
    assert ev.spans == [(2, 9)] and ev.rows.tolist()[0] == 11
    with pytest.raises(ValueError, match="not found"):
        locate(tok, prompt, True, ["blue"], question)
    with pytest.raises(ValueError, match="more than once"):
        locate(tok, prompt, True, ["hay"], question)


# --- the vectorized S2O coverage and rank diagnostics against their former per-row loops ---


def _visible_keys_loop(perms, pass2_tiles, rows, seq_len, *, segment_len, local_window, block_m,
                       block_n, q_perm):  # fmt: skip
    """Oracle: ``s2o_visible_keys`` as it was, one query row at a time."""
    q_idx, kv_idx = perms
    B, Hq, _ = q_idx.shape
    dev = rows.device
    keys = torch.arange(seq_len, device=dev)
    out = torch.zeros(B, Hq, len(rows), seq_len, dtype=torch.bool, device=dev)
    seg = rows // segment_len
    seg_start = seg * segment_len
    lo = (seg_start - local_window).clamp_min(0)
    out |= ((keys[None, :] >= lo[:, None]) & (keys[None, :] <= rows[:, None]))[None, None]
    for i, p in enumerate(rows.tolist()):
        n, s = int(seg[i]), int(seg_start[i])
        e = min(s + segment_len, seq_len)
        if q_perm:
            slot = (q_idx[:, :, s:e].to(dev) == p).long().argmax(-1)  # [B, Hq] local slot
        else:
            slot = torch.full((B, Hq), p - s, device=dev, dtype=torch.long)
        tile = s // block_m + slot // block_m
        walked = torch.gather(pass2_tiles.to(dev), -1, tile[..., None])[..., 0] * block_n
        if kv_idx.shape[-1] == 0:
            continue
        ranked = kv_idx[:, :, n].to(dev).long()  # [B, Hq, P_max], -1 padded
        take = torch.arange(ranked.shape[-1], device=dev) < walked[..., None]
        take &= ranked >= 0
        hit = torch.zeros(B, Hq, seq_len + 1, dtype=torch.bool, device=dev)
        hit.scatter_(-1, torch.where(take, ranked, seq_len), take)
        out[:, :, i] |= hit[..., :seq_len]
    return out


def _ranks_loop(q, k, rows, keys, p, plan, stats, knobs):
    """Oracle: ``s2o_ranks`` as it was (a loop over the rows, a host check of the evidence)."""
    q_idx, kv_idx = plan
    B, Hq, L, D = q.shape
    S, W = knobs["segment_len"], knobs["local_window"]
    bm = knobs["block_m"]
    seg = int(rows[-1]) // S
    seg_start = seg * S
    prefix = max(0, seg_start - W)
    nan = torch.full((B, Hq), float("nan"), device=q.device)
    walked = stats.extra["pass2_tiles"].to(q.device).float()
    most = stats.extra["pass2_tiles_max"].to(q.device).float()
    shares = []
    for r in rows.tolist():
        if r < seg_start:
            continue
        if knobs["q_perm"]:
            slot = (q_idx[:, :, seg_start : min(seg_start + S, L)] == r).long().argmax(-1)
        else:
            slot = torch.full((B, Hq), r - seg_start, device=q.device, dtype=torch.long)
        tile = seg_start // bm + slot // bm
        w = torch.gather(walked, -1, tile[..., None])[..., 0]
        shares.append(w / most[tile].clamp_min(1))
    out = {"walk_share": torch.stack(shares).mean(0) if shares else nan}
    if prefix == 0:
        return {**out, "rank_segment_mean": nan, "rank_question_mean": nan}
    ranked_ev = keys[:prefix]
    if not bool(ranked_ev.any()):
        return {**out, "rank_segment_mean": nan, "rank_question_mean": nan}
    ev_mass = (p[..., :prefix] * ranked_ev).mean(2)  # [B, Hq, prefix]
    top = ev_mass.argmax(-1)  # [B, Hq]
    order = kv_idx[:, :, seg, :prefix].long()  # segment-mean order
    rank_seg = (order == top[..., None]).long().argmax(-1).float() / prefix
    Hkv = k.shape[1]
    qmean = q[:, :, rows].float().mean(2)  # [B, Hq, D]
    kk = k[:, :, :prefix].float().repeat_interleave(Hq // Hkv, 1)
    s_q = torch.einsum("bhd,bhld->bhl", qmean, kk)
    s_top = torch.gather(s_q, -1, top[..., None])
    rank_q = (s_q > s_top).sum(-1).float() / prefix
    return {**out, "rank_segment_mean": rank_seg, "rank_question_mean": rank_q}


# L = 200 is not a multiple of block_m = 16; segments [0, 64), [64, 128), [128, 192), [192, 200)
RANDOM_ROWS = {
    "three segments": [63, 64, 65, 100, 127, 128, 129, 150, 191],
    "to the end": [0, 5, 64, 127, 150, 192, 193, 199],
    "last segment": [192, 195, 199],
    "first segment": [0, 3, 40, 63],
}


def _random_s2o(seed, local_window, L=200, S=64, bm=16, bn=16, dense_tail=0):
    """Random Q/K, the reference Step 1 and random walk lengths (up to one tile past the
    ranked prefix, so that -1 padding is walked over too)."""
    from s2o.reference import s2o_permutations
    from s2o.stats import s2o_stats

    gen = torch.Generator().manual_seed(seed)
    q, k, _ = _qkv(L=L, Hq=4, Hkv=2, D=16, seed=seed)
    perms = s2o_permutations(q, k, S, local_window, dense_tail=dense_tail)
    n_tiles = sum(-(-min(S, L - s) // bm) for s in range(0, L, S))
    ranked_tiles = torch.tensor(
        [
            -(-max(0, s - local_window) // bn)
            for s in range(0, L, S)
            for _ in range(0, min(S, L - s), bm)
        ]
    )
    assert ranked_tiles.numel() == n_tiles
    tiles = (torch.rand(1, 4, n_tiles, generator=gen) * (ranked_tiles + 2)).long()
    stats = s2o_stats(tiles, L, S, local_window, bm, bn, None)
    return (
        q,
        k,
        perms,
        stats,
        dict(segment_len=S, local_window=local_window, block_m=bm, block_n=bn),
    )


# on a GPU the functions take their device paths (no host sync), which the CPU tests do not reach
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_perm", [True, False])
@pytest.mark.parametrize("local_window", [0, 32])
@pytest.mark.parametrize("rows", sorted(RANDOM_ROWS))
@pytest.mark.parametrize("seed", [0, 1])
def test_visible_keys_match_the_per_row_loop(q_perm, local_window, rows, seed, device):
    from s2o.reference import s2o_visible_keys

    q, k, perms, stats, geo = _random_s2o(seed, local_window, dense_tail=5 * seed)
    perms = tuple(t.to(device) for t in perms)
    rows = torch.tensor(RANDOM_ROWS[rows], device=device)
    tiles = stats.extra["pass2_tiles"].to(device)
    got = s2o_visible_keys(perms, tiles, rows, q.shape[2], q_perm=q_perm, **geo)
    want = _visible_keys_loop(perms, tiles, rows, q.shape[2], q_perm=q_perm, **geo)
    assert got.dtype == torch.bool and got.shape == want.shape and got.device == rows.device
    assert torch.equal(got, want)
    if rows[-1] >= 64 and bool(tiles.any()):  # something past Pass-1 was walked
        pass1 = _visible_keys_loop(perms, torch.zeros_like(tiles), rows, q.shape[2],
                                   q_perm=q_perm, **geo)  # fmt: skip
        assert bool((want & ~pass1).any())


@pytest.mark.parametrize("device", DEVICES)
def test_visible_keys_without_a_ranked_prefix(device):
    """One segment (``L < S``): ``kv_idx`` has no columns, only Pass-1's keys are visible."""
    from s2o.reference import s2o_visible_keys

    q, k, perms, stats, geo = _random_s2o(0, 0, L=50)
    assert perms[1].shape[-1] == 0
    perms = tuple(t.to(device) for t in perms)
    rows = torch.tensor([0, 17, 49], device=device)
    tiles = stats.extra["pass2_tiles"].to(device)
    got = s2o_visible_keys(perms, tiles, rows, 50, q_perm=True, **geo)
    assert torch.equal(got, _visible_keys_loop(perms, tiles, rows, 50, q_perm=True, **geo))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_perm", [True, False])
@pytest.mark.parametrize("local_window", [0, 32])
@pytest.mark.parametrize("rows", sorted(RANDOM_ROWS))
@pytest.mark.parametrize("evidence", ["in the prefix", "after the prefix"])
def test_ranks_match_the_per_row_loop(q_perm, local_window, rows, evidence, device):
    from eval.evidence import S2O_KEYS, s2o_ranks

    q, k, perms, stats, geo = _random_s2o(1, local_window)
    q, k = q.to(device), k.to(device)
    perms = tuple(t.to(device) for t in perms)
    stats.extra["pass2_tiles"] = stats.extra["pass2_tiles"].to(device)  # as the kernels leave it
    L = q.shape[2]
    rows = torch.tensor(RANDOM_ROWS[rows])  # the probe passes its CPU rows
    keys = torch.zeros(L, dtype=torch.bool)
    if evidence == "in the prefix":
        keys[[3, 20, 21, 70, 90, 140]] = True
    else:  # past every ranked prefix: no evidence key is ranked, NaN ranks
        keys[[193, 196]] = True
    keys = keys.to(device)
    p = dense_probs(q, k, rows.to(device), 0.25)
    knobs = dict(geo, q_perm=q_perm)
    want = _ranks_loop(q, k, rows.to(device), keys, p, perms, stats, knobs)
    for rows_in in (rows, rows.to(device)):  # CPU rows (no sync) or device rows (one)
        got = s2o_ranks(q, k, rows_in, keys, p, perms, stats, knobs)
        assert set(got) == set(S2O_KEYS)
        for key in S2O_KEYS:
            assert got[key].device == q.device
            torch.testing.assert_close(got[key], want[key], equal_nan=True, rtol=0, atol=0)
    prefix = max(0, (int(rows[-1]) // 64) * 64 - local_window)
    no_rank = prefix == 0 or evidence == "after the prefix"
    assert bool(got["rank_segment_mean"].isnan().all()) == no_rank
    assert not bool(got["walk_share"].isnan().any())


@pytest.mark.gpu
def test_probe_does_not_wait_for_the_gpu():
    """On CUDA tensors S2O's coverage and rank diagnostics queue their work without a host
    sync; the probe syncs once per layer, to copy its results to the CPU."""
    import warnings

    from eval.evidence import s2o_ranks
    from s2o.reference import s2o_visible_keys

    q, k, v, ev = _needle_case()
    q, k, v = q.cuda(), k.cuda(), v.cuda()
    bound = bind("s2o", **KNOBS["s2o"])
    plan = bound.estimate(q, k, v)
    _, stats = bound.attend(q, k, v, plan)
    stats.extra["pass2_tiles"] = stats.extra["pass2_tiles"].cuda()
    rows, keys = ev.rows.cuda(), ev.keys.cuda()
    p = dense_probs(q, k, rows, 0.25)
    probe = EvidenceProbe()
    probe.start(ev)
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        s2o_visible_keys(plan, stats.extra["pass2_tiles"], rows, q.shape[2], **bound.knobs)
        s2o_ranks(q, k, ev.rows, keys, p, plan, stats, dict(bound.knobs))
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            probe(3, q, k, plan, stats, None, bound)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert probe.summary()["evidence_tokens"] == 1


def test_recall_is_nan_where_the_head_has_almost_no_evidence_mass():
    """A head whose dense mass on the evidence is below MIN_MASS gets no recall (None), not a
    kept share divided by a clamped mass; dense attention's recall is 1 wherever it is defined;
    the analysis masks such heads in records made before the rule."""
    import numpy as np

    from analysis.retrieval_diagnosis import head_recall
    from eval.evidence import MIN_MASS

    probe = EvidenceProbe()
    probe.start(_needle_case()[3])
    mass = torch.tensor([[[0.5, MIN_MASS / 10, 1e-35, 0.0]]])  # [B=1, Hq=4]
    kept = mass.clone()
    probe.layers[0] = {"mass": mass[0], "kept": kept[0], "covered": torch.ones(1, 4)}
    out = probe.summary()
    assert out["recall"] == [[1.0, None, None, None]]
    old = {"recall": [[1.0, 0.0, 0.00278, None]], "mass": [[0.5, 0.0, 0.0, 0.0]]}
    got = head_recall(old)
    assert got[0, 0] == 1.0 and np.isnan(got[0, 1:]).all()


def test_make_all_writes_the_retrieval_page_from_the_pinned_records(tmp_path):
    """make_all's retrieval section reads the records pinned in results/manifest.yaml and writes
    the page and figure beside the other artifacts; dense attention's recall is 1 wherever
    defined."""
    import numpy as np
    import yaml

    from analysis import retrieval_diagnosis as rd
    from analysis.make_all import Ctx

    results = Path(__file__).resolve().parents[1] / "results"
    manifest = yaml.safe_load((results / "manifest.yaml").read_text())
    if not rd.pinned(manifest, results):
        pytest.skip("no retrieval records pinned")
    sec = rd.section(Ctx(results, tmp_path, manifest, {}))
    assert sec.files[0] == rd.PAGE and (tmp_path / rd.PAGE).is_file()
    assert "| 32768 | niah_multikey_2 | full |" in "\n".join(sec.body)
    full = rd.load(rd.pinned(manifest, results)[0])
    assert full["metrics"]["method"] == "full"
    mats = np.stack([rd.head_recall(s["evidence"]) for s in full["_samples"].values()])
    assert np.nanmin(mats) == pytest.approx(1.0)


def test_the_diagnosis_labels_every_named_variant_of_s2o():
    """A record with a named variant on (s2o.methods.s2o.NAMED_VARIANTS) is its own row, so two
    S2O records on the same samples never share the label ``s2o``."""
    from analysis import retrieval_diagnosis as rd

    def rec(**knobs):
        return {"metrics": {"method": "s2o", "knobs": {"tau": 0.005, **knobs}}}

    assert rd.label(rec()) == "s2o"
    assert rd.label(rec(step1_score_bits=32, mean_correction=False, dense_tail=0)) == "s2o"
    assert rd.label(rec(step1_score_bits=16)) == "s2o step1_score_bits=16"
    assert rd.label(rec(mean_correction=True)) == "s2o mean_correction=True"
    assert rd.label(rec(tail_rank=128, tau=0.01)) == "s2o tail_rank=128 tau=0.01"


def test_the_generated_diagnosis_refuses_to_explain_few_samples_and_flags_recall_reversals():
    from analysis import retrieval_diagnosis as rd

    row = lambda n, walk, r_seg, r_q, rec="0.500": [  # noqa: E731
        "s2o",
        32768,
        "dense attention",
        "lost",
        n,
        9,
        rec,
        walk,
        r_seg,
        r_q,
        "0.50",
    ]
    few = rd.verdict([row(rd.MIN_LOST - 1, "0.300", "0.800", "0.010")])
    assert "Too few samples" in few and "Step 1's one ranking" not in few
    late = rd.verdict([row(rd.MIN_LOST, "0.300", "0.800", "0.010")])
    assert "Step 1's one ranking per segment" in late
    kept = rd.verdict([row(rd.MIN_LOST, "0.300", "0.100", "0.010", rec="0.950")])
    assert "not explained by the question rows missing the needle" in kept
    cell = dict(length=32768, task="niah_multikey_2", n=50)
    rows = [
        dict(cell, method="full", correct=22, recall=1.0,
             vs_flexprefill=dict(test="mcnemar_exact", n10=0, n01=12, p_value=4.9e-4,
                                p_holm=0.002)),
        dict(cell, method="flexprefill", correct=34, recall=0.939,
             vs_full=dict(test="mcnemar_exact", n10=12, n01=0, p_value=4.9e-4, p_holm=0.002)),
    ]  # fmt: skip
    text = rd.recall_vs_accuracy(rows)
    assert text.count("does not explain") == 1 and "full 22/50 at 1.000" in text
    rows[0]["vs_flexprefill"]["p_holm"] = rows[1]["vs_full"]["p_holm"] = 0.2
    assert rd.recall_vs_accuracy(rows) == ""


def test_the_summary_line_is_generated_from_the_paired_tests():
    from analysis import retrieval_diagnosis as rd

    cell = dict(length=32768, task="niah_multikey_2", n=50)
    rows = [
        dict(cell, method="full", correct=22, density=1.0, recall=1.0),
        dict(cell, method="s2o", correct=25, density=0.359, recall=0.8,
             vs_full=dict(n10=5, n01=2, p_holm=0.453),
             vs_flexprefill=dict(n10=1, n01=10, p_holm=0.0234)),
        dict(cell, method="flexprefill", correct=34, density=0.345, recall=0.9),
        dict(cell, task="all", method="s2o", correct=25, density=0.359, recall=0.8),
        dict(cell, method="s2o dense_tail=128", correct=27, density=0.37, recall=1.0,
             vs_s2o=dict(n10=3, n01=1, p_holm=1.0)),
        dict(cell, method="flashprefill", correct=22, density=0.193, recall=1.0,
             vs_full=dict(n10=5, n01=5, p_holm=1.0)),
    ]  # fmt: skip
    pooled, line, variant, baseline = rd.summary(rows)  # the references get no line of their own
    assert pooled == "1 task pooled at 32768 tokens: s2o answered 25/50 at density 0.359."
    assert line == (
        "niah_multikey_2 at 32768 tokens: s2o answered 25/50 at density 0.359; dense attention "
        "22/50 at density 1.000 (won 5, lost 2; Holm p = 0.45), FlexPrefill 34/50 at density "
        "0.345 (won 1, lost 10; Holm p = 0.023)."
    )
    assert variant.endswith("S2O's default 25/50 at density 0.359 (won 3, lost 1; Holm p = 1).")
    assert baseline == (
        "niah_multikey_2 at 32768 tokens: flashprefill answered 22/50 at density 0.193; dense "
        "attention 22/50 at density 1.000 (won 5, lost 5; Holm p = 1)."
    )


def test_fractional_scores_get_the_sign_flip_test_and_pooled_rows_their_own_family():
    """niah_multivalue's fractional scores: the exact sign-flip test (won/lost counted from the
    differences); the pooled rows are Holm-adjusted among themselves, the per-task rows apart."""
    from analysis import retrieval_diagnosis as rd
    from eval.significance import paired_test, sign_flip_test

    a, b = [1.0, 0.5, 0.75, 1.0, 0.0] * 2, [0.5, 0.5, 0.25, 1.0, 0.0] * 2
    t = paired_test(a, b)
    assert t["test"] == "sign_flip_exact" and (t["n10"], t["n01"]) == (4, 0)
    assert t["p_value"] == sign_flip_test(a, b)["p_value"] == 0.125
    assert paired_test([1.0, 0.0], [0.0, 0.0])["test"] == "mcnemar_exact"

    def rec(method, scores, task="niah_multivalue"):
        one = dict(task=task, length=16384, density=0.5)
        samples = {f"t/{i}": dict(one, id=f"t/{i}", score=x) for i, x in enumerate(scores)}
        return {"_samples": samples, "metrics": {"method": method, "knobs": {}}}

    recs = {"full": rec("full", b), "s2o": rec("s2o", a)}
    rows = {(r["task"], r["method"]): r for r in rd.accuracy_rows(recs)}
    per, pooled = rows[("niah_multivalue", "s2o")], rows[("all", "s2o")]
    # one test in each family: Holm leaves each p as it is
    assert per["vs_full"]["p_holm"] == per["vs_full"]["p_value"] == 0.125
    assert pooled["vs_full"]["p_holm"] == pooled["vs_full"]["p_value"] == 0.125


def _kernel_rec(err, walk):
    rows = [
        {
            "id": "s/1",
            "layer": 0,
            "rel_err": err,
            "rel_err_question_rows": err,
            "same_walk_share": walk,
            "density_kernel": 0.3,
            "density_reference": 0.31,
        }
    ]
    return {
        "id": "abc",
        "environment": {"device_name": "GPU", "torch": "t", "triton": "x", "git_revision": "r"},
        "metrics": {
            "rows": rows,
            "summary": {
                "max_rel_err": err,
                "max_rel_err_question_rows": err,
                "min_same_walk_share": walk,
            },
        },
    }


def test_kernel_on_samples_part_says_match_or_departure():
    from analysis import retrieval_diagnosis as rd

    good = rd.kernel_part([_kernel_rec(0.002, 0.999)])
    assert any("matches its reference" in line for line in good)
    assert any("| `abc` | 1 | 1 | 0.0020 |" in line for line in good)
    assert any("1.0e-02" in line for line in good)  # the density gap
    bad = rd.kernel_part([_kernel_rec(0.002, 0.9)])
    assert any("departs from its reference" in line for line in bad)
    assert any("departs" in line for line in rd.kernel_part([_kernel_rec(0.05, 1.0)]))
    assert rd.kernel_part([]) == []


def test_another_pinned_model_gets_a_page_of_its_own(tmp_path):
    """A model pinned under records.retrieval beside the main one: its own page and figure
    (retrieval_diagnosis_<model>.md), linked from the section with where its records ran and
    its summary lines; the main model's page stays where it was."""
    import copy

    import yaml

    from analysis import retrieval_diagnosis as rd
    from analysis.make_all import Ctx

    results = Path(__file__).resolve().parents[1] / "results"
    manifest = yaml.safe_load((results / "manifest.yaml").read_text())
    main = rd.pinned(manifest, results)
    if not main:
        pytest.skip("no retrieval records pinned")
    man = copy.deepcopy(manifest)
    man["records"]["retrieval"]["other_model"] = [str(p.relative_to(results)) for p in main[:2]]
    assert rd.pinned_models(man, results)[0] == rd.MAIN_MODEL
    sec = rd.section(Ctx(results, tmp_path, man, {}))
    name = rd.page_name("other_model")
    assert name == "retrieval_diagnosis_other_model.md" and rd.page_name(rd.MAIN_MODEL) == rd.PAGE
    assert (tmp_path / name).is_file() and (tmp_path / rd.PAGE).is_file()
    assert sec.files.index(rd.PAGE) < sec.files.index(name)
    body = "\n".join(sec.body)
    assert "The same diagnosis on other_model (records made on " in body and f"({name})" in body
    assert (tmp_path / name).read_text().count("- `results/accuracy/") == 2  # its two only
