"""Pass-2's early-stop walk in Gluon on Hopper: one ``while`` loop over a cp.async ring.

Triton pipelines only ``for`` loops, so the Triton walk (:func:`.s2o_attention._ranked_walk`) is
a ``while`` loop over chunks of tiles with a pipelined ``for`` loop inside: every chunk drains and
refills the pipeline, and the tiles of the stop's chunk after the stop are computed as
identities. Gluon hands the program its shared memory and its asynchronous copies, so this walk is
one ``while`` loop over a ring of three K/V slots that ends at the stop (no dead tiles, no
refills). Tile ``j``'s ``P V`` and tile ``j + 1``'s ``QK`` are issued back to back, so the tensor
cores run both while the warps reduce tile ``j``'s stop flags, wait for tile ``j + 1``'s rows and
issue tile ``j + 2``'s cp.async copies; the next softmax waits for both (wgmma completes in
order). At the stop the speculative ``QK`` is waited for and dropped.

One program is one ``BLOCK_M`` query tile of ``Q_perm`` order of one (batch, query head), as in
``_s2o_pass2_kernel``: it restarts from the Pass-1 state (``acc = o * l``) and applies the same
per-tile rule to the same ``m`` and ``l`` with ``stop_tile="keep"`` (the tile that triggers the
stop is added and counted), so the visits are the Triton walk's; the arithmetic of a tile is the
same sequence of operations.

Pass-2's default walk wherever its scope takes the call (``Launch(walk=None)``);
``walk="triton"`` and ``walk="gluon"`` choose one (the latter refused outside the scope, naming
why). The GPU test ``test_gpu_gluon_walk_equals_triton_walk`` holds it to the Triton walk's visits
and output; ``benchmarks.kernel_probe`` times both on one input.

Scope (:func:`unsupported`): an sm_90 GPU (wgmma), bf16 or fp16, head_dim 128, 128 x 128 tiles,
8 warps, every ranked tile full (``EVEN``: causal, ``S`` and ``W`` multiples of 128, no walk
budget or top-k), Q_perm and gathered keys, an int32 ``kv_perm``, no dense tail or tail rank,
and a Triton whose Gluon has cp.async and wgmma (3.5 and later).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

# Gluon is experimental and renames its builtins: Triton 3.5 and 3.6 spell these
# async_copy_global_to_shared and thread_barrier, later releases async_load and barrier
_cp_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

BLOCK, HEAD_D, NUM_WARPS = 128, 128, 8
STAGES = (3,)  # ring slots: tile j (P V), j + 1 (QK), j + 2 (in flight); 224 KiB of 227


def unsupported(*, capability, dtype, head_d, block_m, block_n, even, keep, use_qperm, gather,
                kv_dtype, dense_tail, tail_rank, launch, aligned=True) -> str | None:  # fmt: skip
    """Why the Gluon walk does not take this Pass-2 call (the first reason), or ``None``.
    ``capability``: the device's CUDA compute capability, ``None`` off CUDA; ``aligned``: Q, K
    and V start on 16 bytes and their batch, head and row strides are multiples of 16 elements
    (what the compiler needs to see to copy rows 16 bytes at a time: :func:`aligned`)."""
    if capability != (9, 0):
        return f"needs an sm_90 GPU (H100/H200: wgmma), got compute capability {capability}"
    checks = (
        (dtype in (torch.bfloat16, torch.float16), f"takes bf16 or fp16, got {dtype}"),
        (head_d == HEAD_D, f"takes head_dim {HEAD_D}, got {head_d}"),
        (block_m == block_n == BLOCK, f"takes {BLOCK} x {BLOCK} tiles, got {block_m} x {block_n}"),
        (even, "needs every ranked tile full (causal, segment_len and local_window multiples "
               "of block_n, no walk_budget or topk_ratio)"),
        (keep, "implements stop_tile='keep' only"),
        (use_qperm and gather, "walks Q_perm tiles over gathered keys only"),
        (kv_dtype == torch.int32, f"reads an int32 kv_perm, got {kv_dtype}"),
        (dense_tail == 0 and tail_rank == 0, "has no dense_tail or tail_rank"),
        (aligned, "needs Q, K, V on 16 bytes with strides of multiples of 16 elements"),
    )  # fmt: skip
    for ok, why in checks:
        if not ok:
            return why
    if launch is not None:
        if launch.num_warps not in (None, NUM_WARPS):
            return f"runs {NUM_WARPS} warps, launch asks num_warps={launch.num_warps}"
        if launch.sub_n not in (None, BLOCK):
            return f"computes whole {BLOCK}-key tiles, launch asks sub_n={launch.sub_n}"
        if launch.num_stages not in (None, *STAGES):
            return f"holds {STAGES} ring slots, launch asks num_stages={launch.num_stages}"
    return None


def aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor starts on 16 bytes and its strides but the last (1) are multiples of
    16 elements (Triton specializes such arguments, so cp.async can copy 16 bytes a time)."""
    return all(t.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)  # fmt: skip


@gluon.jit
def _issue(k_smem, v_smem, slot, K_head, V_head, KVP_row, j, stride_kl: gl.constexpr,
           stride_vl: gl.constexpr, BLOCK_N: gl.constexpr, HEAD: gl.constexpr,
           load_l: gl.constexpr):  # fmt: skip
    """cp.async of ranked tile ``j``'s K and V rows (gathered through ``kv_perm``) into ``slot``."""
    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, load_l))
    idx = gl.load(KVP_row + cols).to(gl.int64)
    offs_d = gl.arange(0, HEAD, gl.SliceLayout(0, load_l))
    _cp_load(k_smem.index(slot), K_head + idx[:, None] * stride_kl + offs_d[None, :])
    _cp_load(v_smem.index(slot), V_head + idx[:, None] * stride_vl + offs_d[None, :])


@gluon.jit
def _s2o_pass2_gluon_kernel(
    Q, K, V, O, QP, KVP, M_buf, L_buf, O_buf, VISITED,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl: gl.constexpr, stride_vb,
    stride_vh, stride_vl: gl.constexpr, stride_pb, stride_ph, stride_pn, L, H, GROUP, S, W,
    N_TILES, qk_scale, tau,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD: gl.constexpr, RING: gl.constexpr,
    EARLY_STOP: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Grid ``(query tiles, B * Hq)``, the last query tile first; ``VISITED[b*Hq + h, tile]``
    gets the tiles walked. ``EARLY_STOP`` off walks every ranked tile."""
    dt: gl.constexpr = Q.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    load_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD], dt)

    tile = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest walks first
    bh = gl.program_id(1).to(gl.int64)
    h = bh % H
    b = bh // H
    a = tile * BLOCK_M
    seg = a // S
    seg_start = seg * S
    n_tiles = gl.maximum(seg_start - W, 0) // BLOCK_N  # EVEN: the ranked prefix is whole tiles

    k_smem = gl.allocate_shared_memory(dt, [RING, BLOCK_N, HEAD], smem_l)
    v_smem = gl.allocate_shared_memory(dt, [RING, BLOCK_N, HEAD], smem_l)
    q_smem = gl.allocate_shared_memory(dt, [BLOCK_M, HEAD], smem_l)
    K_head = K + b * stride_kb + (h // GROUP) * stride_kh
    V_head = V + b * stride_vb + (h // GROUP) * stride_vh
    KVP_row = KVP + b * stride_pb + h * stride_ph + seg * stride_pn
    for i0 in gl.static_range(RING - 1):  # the ring's first tiles, before anything else
        if i0 < n_tiles:
            _issue(k_smem, v_smem, i0, K_head, V_head, KVP_row, i0, stride_kl, stride_vl,
                   BLOCK_N, HEAD, load_l)  # fmt: skip
        cp.commit_group()

    # the tile's query rows (Q_perm order) into shared memory, their Pass-1 state into registers
    end = gl.minimum(seg_start + S, L)
    slots_q = a + gl.arange(0, BLOCK_M, gl.SliceLayout(1, load_l))
    pos_q = gl.load(QP + bh * L + slots_q, mask=slots_q < end, other=0).to(gl.int64)
    offs_dq = gl.arange(0, HEAD, gl.SliceLayout(0, load_l))
    q_ptrs = Q + b * stride_qb + h * stride_qh + pos_q[:, None] * stride_ql + offs_dq[None, :]
    q_smem.store(gl.load(q_ptrs, mask=(slots_q < end)[:, None], other=0.0))
    slots = a + gl.arange(0, BLOCK_M, rows_l)
    row_ok = slots < end
    pos = gl.load(QP + bh * L + slots, mask=row_ok, other=0).to(gl.int64)
    st = bh * L + pos
    m_i = gl.load(M_buf + st, mask=row_ok, other=0.0)
    l_i = gl.load(L_buf + st, mask=row_ok, other=1.0)
    offs_d = gl.arange(0, HEAD, gl.SliceLayout(0, mma))
    o1 = gl.load(O_buf + st[:, None] * HEAD + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    acc = o1.to(gl.float32) * l_i[:, None]
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)

    gl.static_assert(RING == 3)
    visited = n_tiles * 0
    j = n_tiles * 0
    go = n_tiles > 0
    # OVERLAP: QK(j + 1) is issued right after P V(j), so the tensor cores run both while the
    # warps reduce tile j's stop flags, wait for tile j + 1's rows and issue tile j + 2's copies;
    # the next softmax waits for both (wgmma completes in order). Needs RING == 3: the slots hold
    # tile j (P V), j + 1 (QK) and j + 2 (in flight).
    cp.wait_group(RING - 2)  # tile 0 has landed (this thread's copies)
    fence_async_shared()
    _barrier()
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero, use_acc=False,
                          is_async=True)  # fmt: skip
    acc_tok = warpgroup_mma_init(acc)
    while go:
        slot = j % RING
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc_tok))
        s = s * qk_scale
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        gain = gl.sum(p, 1)
        l_old = l_i * alpha
        acc_tok = warpgroup_mma(gl.convert_layout(p.to(dt), p_op), v_smem.index(slot),
                                acc * alpha[:, None], is_async=True)  # fmt: skip
        l_i = l_old + gain
        m_i = m_new
        visited += 1
        j += 1
        if EARLY_STOP:  # reduced while P V runs: does any row still gain?
            flags = ((gain >= tau * l_old) & row_ok).to(gl.int32)
            go = (gl.max(flags, 0) > 0) & (j < n_tiles)
        else:
            go = j < n_tiles
        # tile j's rows (issued one tile earlier) landed for every thread; every warpgroup is past
        # its wait for P V(j - 2), so tile j - 2's slot takes tile j + 1
        cp.wait_group(0)
        fence_async_shared()
        _barrier()
        jn = j + 1
        if go & (jn < n_tiles):
            _issue(k_smem, v_smem, jn % RING, K_head, V_head, KVP_row, jn, stride_kl, stride_vl,
                   BLOCK_N, HEAD, load_l)  # fmt: skip
        cp.commit_group()
        # QK of tile j (speculative at the stop: its result is then waited for and dropped)
        s_tok = warpgroup_mma(q_smem, k_smem.index(j % RING).permute((1, 0)), zero,
                              use_acc=False, is_async=True)  # fmt: skip
    s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc_tok))
    cp.wait_group(0)  # the ring's copies past the stop, before the shared memory goes

    gl.store(VISITED + bh * N_TILES + tile, visited)
    out = acc / l_i[:, None]
    gl.store(O + bh * L * HEAD + pos[:, None] * HEAD + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip


def launch_walk(q, k, v, out, q_perm, kv_perm, state, visited, *, segment_len, local_window,
                qk_scale, tau, early_stop, stages) -> None:  # fmt: skip
    """Launch the walk (the caller checked :func:`unsupported`); fills ``out`` and ``visited``."""
    B, Hq, L, D = q.shape
    m, l, o1 = state
    n_tiles = visited.shape[-1]
    _s2o_pass2_gluon_kernel[(n_tiles, B * Hq)](
        q, k, v, out, q_perm, kv_perm, m, l, o1, visited,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), kv_perm.stride(0), kv_perm.stride(1),
        kv_perm.stride(2), L, Hq, Hq // k.shape[1], segment_len, local_window, n_tiles,
        qk_scale, float(tau), BLOCK_M=BLOCK, BLOCK_N=BLOCK, HEAD=D, RING=stages,
        EARLY_STOP=bool(early_stop), num_warps=NUM_WARPS,
    )  # fmt: skip
