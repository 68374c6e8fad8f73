"""Evidence recall: did a method compute the keys the answer needs?

For a sample whose evidence is known (RULER's niah tasks name the asked needles and the question,
``eval/tasks/ruler/niah.py``), per layer and query head of one prefill:

* ``mass``: the share of the *dense* attention of the question's query rows (the question, the
  chat template's tail and the answer prefix: every token from the question to the end of the
  prompt) that falls on the evidence tokens (the asked needles), averaged over those rows;
* ``kept``: the part of that mass inside the keys the method actually computed for those rows
  (:meth:`s2o.methods.BoundMethod.coverage`);
* ``recall = kept / mass``: 1 for dense attention; a method that skipped the needle's tiles for
  the question has a recall near 0 in the heads that read the needle.

A sample's ``evidence_recall`` is the mass-weighted recall over all sparse layers and heads,
``sum(kept) / sum(mass)``: heads that do not read the evidence barely count. For S2O the probe
also records where Step 1 ranked the evidence (``s2o``): per layer and head, the share of the
question's ranked prefix that its query tiles walked, and the rank (as a share of the ranked
prefix) of the evidence key with the most dense mass in two orders: the segment-mean query's
order (the paper's Step 1, what the kernel walks) and the question's own mean query's order
(what ranking by the question would give). Evidence ranked late in the first and early in the
second points at the segment-mean ranking; ranked early but not walked points at the stop rule.
With S2O's ``tail_rank`` variant (:mod:`s2o.tail_rank`) the question's last tile walks the tail's
own ranking (its mean query over the last ``tail_rank`` rows), and ``rank_segment_mean`` is the
rank in *that* order: always the order the question's last query tile actually walked.

The probe runs inside the prefill (``s2o.hf.sparse_prefill(..., observe=probe)``), after each
layer's timed span, on the layer's own post-RoPE Q/K: nothing is re-run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Evidence:
    """Where a prompt's evidence and question are, in tokens.

    Attributes:
        keys: ``[L]`` bool, the evidence tokens.
        rows: ``[R]`` int64, the question's query positions (to the end of the prompt).
        spans: ``[(first, last + 1), ...]`` token span of each evidence string.
    """

    keys: torch.Tensor
    rows: torch.Tensor
    spans: list[tuple[int, int]]


def locate(tokenizer, prompt: str, add_special_tokens: bool, evidence: list[str],
           question: str) -> Evidence:  # fmt: skip
    """Token positions of ``evidence`` (each string must occur in ``prompt`` exactly once) and of
    the query rows (from the last occurrence of ``question`` to the end), with the same encoding
    the accuracy job prefills (``add_special_tokens``). Needs a fast tokenizer (offsets)."""
    enc = tokenizer(prompt, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    L = len(enc["input_ids"])
    start = torch.tensor([a for a, _ in offsets])
    end = torch.tensor([b for _, b in offsets])
    real = end > start  # special tokens have empty spans
    keys = torch.zeros(L, dtype=torch.bool)
    spans = []
    for text in evidence:
        where = prompt.find(text)
        if where < 0 or prompt.find(text, where + 1) >= 0:
            found = "not found" if where < 0 else "found more than once"
            raise ValueError(f"evidence {text[:60]!r} {found} in the prompt")
        hit = real & (start < where + len(text)) & (end > where)
        idx = hit.nonzero().flatten()
        keys |= hit
        spans.append((int(idx[0]), int(idx[-1]) + 1))
    q_at = prompt.rfind(question)
    if q_at < 0:
        raise ValueError(f"question {question[:60]!r} not found in the prompt")
    first = int((real & (end > q_at)).nonzero().flatten()[0])
    return Evidence(keys, torch.arange(first, L), spans)


class EvidenceProbe:
    """``observe`` callable for :func:`s2o.hf.sparse_prefill`: set :attr:`evidence` before a
    prefill (``None``: the probe does nothing), read :meth:`summary` after it."""

    def __init__(self):
        self.evidence: Evidence | None = None
        self.layers: dict[int, dict] = {}

    def start(self, evidence: Evidence | None) -> None:
        self.evidence, self.layers = evidence, {}

    @torch.no_grad()
    def __call__(self, layer, q, k, plan, stats, scale, method) -> None:
        ev = self.evidence
        if ev is None:
            return
        B, Hq, L, D = q.shape
        if ev.keys.numel() != L:
            raise ValueError(
                f"evidence was located in {ev.keys.numel()} tokens, the prefill has {L}: "
                "locate it with the prompt and encoding that are prefilled"
            )
        # non_blocking: a plain copy from pageable memory would wait for the device every layer
        rows = ev.rows.to(q.device, non_blocking=True)
        scale = D**-0.5 if scale is None else float(scale)
        p = dense_probs(q, k, rows, scale)  # [B, Hq, R, L]
        keys = ev.keys.to(q.device, non_blocking=True)
        cov = method.coverage(plan, stats, rows, L)
        on_ev = p * keys
        entry = {
            "mass": on_ev.sum(-1).mean(-1),  # [B, Hq]
            "kept": (on_ev * cov).sum(-1).mean(-1),
            "covered": (p * cov).sum(-1).mean(-1),  # dense mass inside the visited keys
        }
        if method.name == "s2o":
            knobs = dict(method.knobs)
            entry.update(s2o_ranks(q, k, ev.rows, keys, p, plan, stats, knobs))  # CPU rows
        # one copy to the CPU (the layer's one host sync; each [B, Hq])
        values = torch.stack([v.float() for v in entry.values()]).cpu()
        self.layers[layer] = dict(zip(entry, values))

    def summary(self) -> dict | None:
        """Per layer and head (batch 0) ``mass``, ``recall`` (``None`` where ``mass`` is below
        :data:`MIN_MASS`) and
        ``covered``, the mass-weighted ``evidence_recall``, and S2O's rank diagnostics."""
        if self.evidence is None or not self.layers:
            return None
        layers = sorted(self.layers)
        get = lambda key: torch.stack([self.layers[i][key][0] for i in layers])  # [layers, Hq]
        mass, kept = get("mass"), get("kept")
        # a head with (almost) no mass on the evidence has no meaningful recall: NaN, not 0
        recall = torch.where(mass >= MIN_MASS, kept / mass.clamp_min(MIN_MASS), torch.nan)
        out = {
            "layers": layers,
            "rows": int(self.evidence.rows.numel()),
            "evidence_tokens": int(self.evidence.keys.sum()),
            "evidence_recall": float(kept.sum() / mass.sum()) if float(mass.sum()) > 0 else None,
            "evidence_mass": float(mass.mean()),
            "mass": _rounded(mass),
            "recall": _rounded(recall),
            "covered": _rounded(get("covered")),
        }
        if "walk_share" in self.layers[layers[0]]:
            out["s2o"] = {key: _rounded(get(key)) for key in S2O_KEYS}
        return out


S2O_KEYS = ("walk_share", "rank_segment_mean", "rank_question_mean")

# A (layer, head)'s recall is recorded only where its dense mass on the evidence is at least this
# (the stored mass is rounded to 5 decimals, so a smaller one reads as 0): dividing a kept share by
# a mass of 1e-30 gave recalls near 0 for dense attention in records made before this rule.
MIN_MASS = 1e-5


def _rounded(x: torch.Tensor) -> list:
    return [[None if v != v else round(float(v), 5) for v in row] for row in x.tolist()]


def dense_probs(q, k, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """``[B, Hq, R, L]`` fp32 causal softmax of the query ``rows`` over every key (GQA)."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    qr = q[:, :, rows].float().reshape(B, Hkv, (Hq // Hkv) * len(rows), D)
    s = (qr @ k.float().transpose(-1, -2)).view(B, Hq, len(rows), L) * scale
    keys = torch.arange(L, device=q.device)
    s = s.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
    return torch.softmax(s, dim=-1)


def s2o_ranks(q, k, rows, keys, p, plan, stats, knobs: dict) -> dict:
    """S2O's ranking diagnostics for the question rows (module docstring), each ``[B, Hq]``:
    ``walk_share`` (walked / ranked tiles of the rows' query tiles, mean over the rows),
    ``rank_segment_mean`` and ``rank_question_mean`` (the rank share, 0 = first, of the ranked
    evidence key with the most dense mass; NaN when no evidence key is in the ranked prefix).
    ``rank_segment_mean`` is read from the ``kv_perm`` row the last row's query tile walked: the
    segment's, or with ``tail_rank`` (when the last row is in the tail) the tail's own row.
    ``rows`` may be on the CPU (the probe passes them so): then nothing here waits for the
    device."""
    q_idx, kv_idx = plan
    B, Hq, L, D = q.shape
    dev = q.device
    S, W = knobs["segment_len"], knobs["local_window"]
    bm = knobs["block_m"]
    rows_h = rows.cpu()  # a no-op for CPU rows
    seg = int(rows_h[-1]) // S
    seg_start = seg * S
    prefix = max(0, seg_start - W)
    nan = torch.full((B, Hq), float("nan"), device=dev)
    walked = stats.extra["pass2_tiles"].to(dev).float()
    most = stats.extra["pass2_tiles_max"].to(dev, non_blocking=True).float()
    # walk share of every row of the last segment at once (rows before it are left out)
    local = rows_h[rows_h >= seg_start] - seg_start  # [R'] slots in original order
    local = local.long().to(dev, non_blocking=True)
    if knobs["q_perm"]:
        seg_perm = q_idx[:, :, seg_start : min(seg_start + S, L)].long()
        slots = torch.arange(seg_perm.shape[-1], device=dev).expand_as(seg_perm)
        inv = torch.empty_like(seg_perm).scatter_(-1, seg_perm - seg_start, slots)
        slot = inv.gather(-1, local.expand(B, Hq, -1)).permute(2, 0, 1)  # [R', B, Hq]
    else:
        slot = local[:, None, None].expand(-1, B, Hq)
    tile = seg_start // bm + slot // bm  # [R', B, Hq]
    w = torch.gather(walked, -1, tile.permute(1, 2, 0)).permute(2, 0, 1)
    shares = (w / most[tile].clamp_min(1)).contiguous()  # laid out as the stack of the rows'
    out = {"walk_share": shares.mean(0) if len(local) else nan}
    if prefix == 0:
        return {**out, "rank_segment_mean": nan, "rank_question_mean": nan}
    ranked_ev = keys[:prefix]
    has_ev = ranked_ev.any()  # a device flag: the NaN case goes through torch.where, no sync
    # the evidence key with the most dense mass among the ranked prefix, per head
    ev_mass = (p[..., :prefix] * ranked_ev).mean(2)  # [B, Hq, prefix]
    top = ev_mass.argmax(-1)  # [B, Hq]
    walked_row, tail = seg, knobs.get("tail_rank", 0)
    if tail and int(rows_h[-1]) >= L - tail:
        # the tail's own row: N + seg - n0 (s2o.tail_rank.tail_rows; eval does not import s2o)
        walked_row = seg + -(-L // S) - max(0, L - tail) // S
    order = kv_idx[:, :, walked_row, :prefix].long()  # the order the last tile walked
    rank_seg = (order == top[..., None]).long().argmax(-1).float() / prefix
    Hkv = k.shape[1]
    qmean = q[:, :, rows.to(dev, non_blocking=True)].float().mean(2)  # [B, Hq, D]
    kk = k[:, :, :prefix].float().repeat_interleave(Hq // Hkv, 1)
    s_q = torch.einsum("bhd,bhld->bhl", qmean, kk)
    s_top = torch.gather(s_q, -1, top[..., None])
    rank_q = (s_q > s_top).sum(-1).float() / prefix
    return {
        **out,
        "rank_segment_mean": torch.where(has_ev, rank_seg, nan),
        "rank_question_mean": torch.where(has_ev, rank_q, nan),
    }
