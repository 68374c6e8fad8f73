"""What the block-sparse baselines (FlexPrefill, XAttention, PBS) share: the plan, the plain-PyTorch
attention with a block mask, the tile statistics, and the small pooling/selection helpers.

A plan says which ``block_size x block_size`` (query block, key block) tiles attention computes.
Plain plans (FlexPrefill, XAttention): ``mask[b, h, r, c]`` over original key blocks, causal
(``c <= r``). PBS plans: ``mask`` holds the selected blocks of the *permuted* key order that lie
before the query's own segment (``key_perm`` maps permuted position -> token); the own segment is
always computed, densely and causally in original order (``segment_size``).

Statistics: a computed tile counts once, tiles above the diagonal never count, so the sparsity is
comparable with S2O's (``s2o.stats``). Counts stay on the tensors' device (no host sync).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..stats import AttentionStats, _cdiv, dense_causal_tile_count
from ..validation import check_choice, check_finite, check_tile, resolve_impl
from .launch_knob import check_settings, to_launch
from .registry import Method, register

IMPLS = ("auto", "reference", "triton")


@dataclass
class BlockPlan:
    """A block-sparse attention plan (see the module docstring).

    Attributes:
        mask: ``[B, Hq, NB, NB]`` bool, ``NB = ceil(L / block_size)``.
        block_size: tile edge.
        key_perm: ``[B, Hq, L]`` int32 permuted position -> token (PBS), else ``None``.
        segment_size: PBS segment length (0 for plain plans).
        kv_idx, kv_count: the kernel's per-query-block lists of ``mask`` (Triton path only).
        extra: method-specific tensors (budgets, query-aware heads, ...).
    """

    mask: torch.Tensor
    block_size: int
    key_perm: torch.Tensor | None = None
    segment_size: int = 0
    kv_idx: torch.Tensor | None = None
    kv_count: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


def block_causal(nb: int, device: torch.device) -> torch.Tensor:
    """``[NB, NB]`` bool, ``c <= r``."""
    r = torch.arange(nb, device=device)
    return r[None, :] <= r[:, None]


def own_segment_tiles(nb: int, seg_blocks: int) -> int:
    """Causal tiles of the own-segment band per head: ``sum_r (r - segment_start(r) + 1)``."""
    return sum(r % seg_blocks + 1 for r in range(nb))


def plan_tiles(plan: BlockPlan) -> torch.Tensor:
    """``[B, Hq]`` float64 tiles computed per head."""
    tiles = plan.mask.sum((-1, -2), dtype=torch.float64)
    if plan.key_perm is not None:
        nb = plan.mask.shape[-1]
        tiles = tiles + own_segment_tiles(nb, plan.segment_size // plan.block_size)
    return tiles


def plan_stats(plan: BlockPlan, seq_len: int) -> AttentionStats:
    bs = plan.block_size
    stats = AttentionStats(plan_tiles(plan), dense_causal_tile_count(seq_len, bs, bs), bs, bs)
    stats.extra.update(plan.extra)
    return stats


def finish_plan(plan: BlockPlan, impl: str, device: torch.device) -> BlockPlan:
    """Build the kernel's index lists on the Triton path (part of the estimation time)."""
    if resolve_impl(impl, device) == "triton":
        from ..kernels.block_sparse import mask_to_lists

        plan.kv_idx, plan.kv_count = mask_to_lists(plan.mask)
    return plan


def key_block_of_token(plan: BlockPlan, seq_len: int) -> torch.Tensor:
    """``[B, Hq, L]`` (or ``[L]``) block id of every key token in the plan's key order."""
    dev = plan.mask.device
    if plan.key_perm is None:
        return torch.arange(seq_len, device=dev) // plan.block_size
    pos = torch.empty_like(plan.key_perm, dtype=torch.long)
    ar = torch.arange(seq_len, device=dev).expand(plan.key_perm.shape)
    pos.scatter_(-1, plan.key_perm.long(), ar)  # token -> permuted position
    return pos // plan.block_size


def visible_keys(
    plan: BlockPlan, rows: torch.Tensor, seq_len: int, kblk: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, Hq, R, L]`` bool: the keys the plan computes for query positions ``rows`` ``[R]``
    (token ``j`` is visible to query ``i`` of block ``r`` when ``j <= i`` and its key block is
    selected for ``r`` or, PBS, it lies in ``r``'s own segment). ``kblk``: a precomputed
    :func:`key_block_of_token`."""
    kblk = key_block_of_token(plan, seq_len) if kblk is None else kblk
    tok = torch.arange(seq_len, device=rows.device)
    sel = plan.mask[:, :, rows // plan.block_size]  # [B, Hq, R, NB]
    if kblk.dim() == 1:
        vis = sel[..., kblk]
    else:
        vis = torch.gather(sel, -1, kblk[:, :, None, :].expand(-1, -1, len(rows), -1))
    if plan.key_perm is not None:
        seg_start = (rows // plan.segment_size) * plan.segment_size
        vis = vis | (tok[None, :] >= seg_start[:, None])
    return vis & (tok[None, :] <= rows[:, None])


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, scale: float | None
) -> torch.Tensor:
    """Plain-PyTorch attention with the plan's token mask (fp32, chunks of query blocks).

    Token ``j`` is visible to query ``i`` (block ``r``) when ``j <= i`` and either its key block is
    selected for ``r`` or (PBS) it lies in ``r``'s own segment. Rows that see no key output 0.
    """
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    bs = plan.block_size
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kblk = key_block_of_token(plan, L)
    kf = k.float().unsqueeze(2)  # [B, Hkv, 1, L, D]
    vf = v.float().unsqueeze(2)
    out = torch.empty_like(q)
    nb = plan.mask.shape[-1]
    chunk = max(1, (1 << 26) // max(1, B * Hq * bs * L))  # query blocks per chunk (~256 MB)
    tok = torch.arange(L, device=q.device)
    for r0 in range(0, nb, chunk):
        r1 = min(nb, r0 + chunk)
        rows = tok[r0 * bs : min(r1 * bs, L)]
        vis = visible_keys(plan, rows, L, kblk)
        qf = q[:, :, rows].float().view(B, Hkv, G, len(rows), D)
        s = (qf @ kf.transpose(-1, -2)).view(B, Hq, len(rows), L) * scale
        p = torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1).nan_to_num(0.0)
        o = p.view(B, Hkv, G, len(rows), L) @ vf
        out[:, :, rows] = o.view(B, Hq, len(rows), D).to(q.dtype)
    return out


def attend(
    q, k, v, plan: BlockPlan, *, scale, impl, launch=None
) -> tuple[torch.Tensor, AttentionStats]:
    """Run a plan with the reference or the shared Triton kernel; returns ``(out, stats)``."""
    if resolve_impl(impl, q.device) == "reference":
        out = reference_attention(q, k, v, plan, scale)
    else:
        from ..kernels.block_sparse import block_sparse_attention, mask_to_lists

        if plan.kv_idx is None:
            plan.kv_idx, plan.kv_count = mask_to_lists(plan.mask)
        out = block_sparse_attention(
            q, k, v, plan.kv_idx, plan.kv_count,
            block_size=plan.block_size, scale=scale,
            key_perm=plan.key_perm, segment_size=plan.segment_size or None,
            launch=to_launch(launch),
        )  # fmt: skip
    return out, plan_stats(plan, q.shape[2])


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def pad_len(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad dim 2 of ``[B, H, L, D]`` to ``length``."""
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))


def mean_pool_tokens(x: torch.Tensor, block: int) -> torch.Tensor:
    """``[B, H, L, D] -> [B, H, NB, D]`` fp32 mean over the tokens of each block (a short last
    block is averaged over its own tokens)."""
    L = x.shape[2]
    nb = _cdiv(L, block)
    s = pad_len(x.float(), nb * block).view(*x.shape[:2], nb, block, x.shape[3]).sum(3)
    counts = torch.full((nb,), float(block), device=x.device)
    counts[-1] = L - (nb - 1) * block
    return s / counts[:, None]


def grouped_scores(qx: torch.Tensor, kx: torch.Tensor, scale: float) -> torch.Tensor:
    """``[B, Hq, M, D] x [B, Hkv, N, D] -> [B, Hq, M, N]`` fp32 ``scale * q k^T``, GQA without
    repeating ``kx``; the product runs in the inputs' dtype (as the official estimators do)."""
    B, Hq, M, D = qx.shape
    Hkv = kx.shape[1]
    s = qx.reshape(B, Hkv, (Hq // Hkv) * M, D) @ kx.transpose(-1, -2)
    return s.view(B, Hq, M, -1).float() * scale


def rank_select(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``x [..., N]``, ``n [...]`` -> bool mask of the ``n`` largest entries (ties: lower index)."""
    order = torch.argsort(x, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(x.shape[-1], device=x.device).expand(x.shape))
    return rank < n.unsqueeze(-1)


def check_impl(impl) -> None:
    check_choice("impl", impl, IMPLS)


def check_block_size(block_size) -> None:
    check_tile("block_size", block_size)


def check_fraction(name: str, value) -> float:
    value = check_finite(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def register_block_sparse(
    name, plan_fn, *, defaults, main_knob, check, plan_takes_impl=False,
    sparsity_increases_with_knob=False, attend_fn=None, attend_knobs=(), layer_knobs=(),
):  # fmt: skip
    """Register a block-sparse method: ``estimate`` builds its plan, ``attend`` is shared.

    Every such method also takes ``launch`` (the block-sparse kernel's Triton launch settings,
    ``{num_warps, num_stages, sub_n}``; ``None``: defaults for the head size and GPU).
    ``plan_fn(q, k, **knobs) -> BlockPlan`` gets every knob but ``impl`` and ``launch`` (unless
    ``plan_takes_impl``, for estimators with a GPU kernel of their own), ``attend_knobs`` and
    ``layer_knobs``. Raising the main knob (a cumulative-mass threshold or budget) keeps more
    blocks, so sparsity falls with it, unless ``sparsity_increases_with_knob`` (FlashPrefill's
    alpha, a fraction of the row's best score). ``attend_fn(q, k, v, plan, *, scale, impl,
    launch, **attend_knobs)`` replaces :func:`attend` (FlashPrefill's mean correction);
    ``layer_knobs``: see :class:`~s2o.methods.registry.Method`.
    """
    not_plan = set(attend_knobs) | set(layer_knobs)

    def estimate(q, k, v, *, impl, launch, **knobs):
        extra = {"impl": impl} if plan_takes_impl else {}
        knobs = {key: val for key, val in knobs.items() if key not in not_plan}
        return finish_plan(plan_fn(q, k, **extra, **knobs), impl, q.device)

    def attend_plan(q, k, v, plan, *, scale, impl, launch, **knobs):
        if attend_fn is None:
            return attend(q, k, v, plan, scale=scale, impl=impl, launch=launch)
        mine = {key: knobs[key] for key in attend_knobs}
        return attend_fn(q, k, v, plan, scale=scale, impl=impl, launch=launch, **mine)

    def check_all(*, launch, **knobs):
        check_settings("launch", launch)
        check(**knobs)

    method = Method(
        name=name,
        estimate=estimate,
        attend=attend_plan,
        defaults={**defaults, "launch": None},
        main_knob=main_knob,
        sparsity_increases_with_knob=sparsity_increases_with_knob,
        check=check_all,
        coverage=lambda plan, stats, rows, seq_len, **_: visible_keys(plan, rows, seq_len),
        layer_knobs=tuple(layer_knobs),
    )
    return register(method)
