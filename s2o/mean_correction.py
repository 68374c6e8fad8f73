"""``mean_correction``: a named S2O variant (not in the paper) in which the ranked keys that a
Pass-2 query tile did not walk enter its softmax through their pooled statistics.

Why: S2O's early stop drops the rest of a tile's ranked prefix outright, so the mass those keys
carry is lost and the row's softmax is renormalized over what was walked. FlashPrefill v2
(qhfan/FlashPrefillv2, ``use_mean_correction``; :mod:`s2o.methods.flashprefill`, step 6) puts
the blocks it prunes back in as one softmax term per block: ``len`` copies of the block's mean
key and mean value. ``mean_correction = True`` (default False: the paper's method) does the same
for S2O's skipped keys, pooled along S2O's own order instead of by position:

* **What is pooled.** Segment ``n``'s ranked prefix (``P_n`` keys of ``kv_perm``, in walk order;
  a ``tail_rank`` tile's own ranking row) is cut into *ranked tiles* of ``block_n`` keys, the
  tiles Pass-2 walks (the last may be shorter). Ranked tile ``j`` has ``n_j`` keys, mean key
  ``K̄_j`` and mean value ``V̄_j`` (fp32 means of the keys and values as the walk reads them).
* **What is corrected.** A query tile whose walk *took* ``t`` ranked tiles (its first ``t``,
  whose keys entered the output) gets every ranked tile ``j >= t`` of its prefix, whatever ended
  the walk: the stop rule, ``walk_budget`` or ``topk_ratio``. With ``stop_tile="keep"`` ``t``
  is the number of tiles visited; with ``"discard"`` the tile that triggered the stop was
  visited but not taken, so it is corrected too. A tile that walked its whole prefix
  (``tau <= 0``, ``dense_tail``) gets nothing.
* **How.** Each corrected tile is one more logit of every row ``q`` of the query tile,
  ``scale * q . K̄_j + log(n_j)``, with value ``V̄_j`` (numerator ``n_j exp(scale q.K̄_j) V̄_j``,
  denominator ``n_j exp(scale q.K̄_j)``), merged into the row's online-softmax state after the
  walk (:func:`merge_pooled`). Where every key of a ranked tile is the same key and value, the
  term equals the tile's exact contribution, so the output is exact dense attention.

What it costs: one mean key and value per skipped ranked tile (``1/block_n`` of the tile's
``Q K^T`` and ``P V``), plus the pooling (a gather of the skipped keys and values). The density
keeps its definition (the ``block_m x block_n`` tiles computed exactly: the corrected tiles are
not counted; ``stats.extra["pooled_tiles"]`` ``[B, Hq, n_query_tiles]`` says how many ranked
tiles each query tile merged through their means); the time is the attention's
(``time_attention_ms``), where the correction runs.

Reference only: the Triton kernels keep the row state in their own buffers and do not return
the row log-sum-exp, so the correction cannot be merged outside them; ``impl='triton'`` (or
``impl='auto'`` on CUDA tensors) with ``mean_correction=True`` is refused, naming both, never
run without it.
"""

from __future__ import annotations

import torch

from .stats import _cdiv


def check_mean_correction(mean_correction, *, impl: str = "reference") -> bool:
    """``mean_correction`` as a bool; ``ValueError`` for a non-bool value and, when it is on,
    for ``impl`` ``'triton'`` (see :func:`refuse_on_triton`)."""
    if not isinstance(mean_correction, bool):
        raise ValueError(f"mean_correction must be a bool (default False), got {mean_correction!r}")
    refuse_on_triton(mean_correction, impl)
    return mean_correction


def refuse_on_triton(mean_correction: bool, impl: str) -> None:
    """``ValueError`` if ``mean_correction`` is on and ``impl`` (resolved or explicit) is
    ``'triton'``: the correction exists on the reference path only."""
    if mean_correction and impl == "triton":
        raise ValueError(
            "mean_correction=True (S2O's pooled correction of the skipped ranked keys) runs on "
            "the reference path only: the S2O Triton kernels do not implement it. impl resolves "
            "to 'triton' (impl='triton', or impl='auto' with CUDA tensors); use "
            "impl='reference', or mean_correction=False"
        )


def pooled_tiles(k: torch.Tensor, v: torch.Tensor, ranked: torch.Tensor, block_n: int):
    """The ranked tiles' pooled statistics.

    Args:
        k, v: ``[B, H, L, D]`` fp32 (repeated per query head); ranked: ``[B, H, P]`` key
            positions in walk order (no padding).
    Returns:
        ``(km, vm)`` ``[B, H, T, D]`` fp32 means of ranked tile ``j`` (keys ``j*block_n`` to
        ``(j+1)*block_n`` of ``ranked``), and ``log_n`` ``[T]`` the log of their key counts;
        ``T = ceil(P / block_n)``.
    """
    B, H, P = ranked.shape
    D = k.shape[-1]
    T = _cdiv(P, block_n)
    idx = ranked[..., None].expand(-1, -1, -1, D)
    counts = (P - torch.arange(T, device=k.device) * block_n).clamp(max=block_n).float()
    pad = (0, 0, 0, T * block_n - P)
    means = []
    for x in (k, v):
        tiles = torch.nn.functional.pad(torch.gather(x, 2, idx), pad)
        means.append(tiles.view(B, H, T, block_n, D).sum(3) / counts[:, None])
    return means[0], means[1], counts.log()


def merge_pooled(q_rows, state, k, v, ranked, taken, block_m: int, block_n: int,
                 scale: float) -> torch.Tensor:  # fmt: skip
    """Merge the skipped ranked tiles' pooled terms into the rows' online-softmax state.

    Args:
        q_rows: ``[B, H, R, D]`` fp32 queries in walk order; state: their ``(m, l, acc)``
            (``[B, H, R]``, ``[B, H, R]``, ``[B, H, R, D]``; ``m`` finite), updated in place.
        k, v: ``[B, H, L, D]`` fp32; ranked: ``[B, H, P]`` the tiles' whole ranked prefix.
        taken: ``[B, H, n_query_tiles]`` ranked tiles each query tile took into its output.
    Returns:
        ``[B, H, n_query_tiles]`` the number of ranked tiles each query tile merged.
    """
    m, l, acc = state
    R = q_rows.shape[2]
    T = _cdiv(ranked.shape[-1], block_n)
    pooled = (T - taken).clamp_min(0)
    if T == 0 or not bool(pooled.any()):
        return pooled
    km, vm, log_n = pooled_tiles(k, v, ranked, block_n)
    first = taken.repeat_interleave(block_m, dim=-1)[..., :R]  # [B, H, R]
    s = torch.einsum("bhrd,bhtd->bhrt", q_rows, km) * scale + log_n
    s = s.masked_fill(torch.arange(T, device=s.device) < first[..., None], float("-inf"))
    m_new = torch.maximum(m, s.amax(dim=-1))
    p = torch.exp(s - m_new[..., None])
    alpha = torch.exp(m - m_new)
    l.copy_(l * alpha + p.sum(dim=-1))
    acc.copy_(acc * alpha[..., None] + torch.einsum("bhrt,bhtd->bhrd", p, vm))
    m.copy_(m_new)
    return pooled
