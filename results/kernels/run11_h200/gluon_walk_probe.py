# ruff: noqa  (the lab script as it ran on the GPU, kept beside its records; not project code)
"""Experiment (issue 47): Pass-2's ranked walk written in Gluon with an explicit cp.async ring.

Triton pipelines only ``for`` loops, so the library's early-stop walk
(:func:`s2o.kernels.s2o_attention._ranked_walk`) is a ``while`` loop over chunks of tiles with a
pipelined ``for`` loop inside: every chunk refills the pipeline, and the tiles of a chunk after
the stop are computed as identities. Here the walk is one ``while`` loop that owns its shared
memory ring: the gathered K/V rows of tile ``j + STAGES - 1`` are copied (cp.async) while tile
``j`` is computed, the loop ends at the stop (no dead tiles, no refills), and the stop flags of a
tile are reduced while its ``P V`` product runs.

Scope: the configuration of the S2O method's defaults on a GPU (causal, every ranked tile full
(``EVEN``), ``stop_tile="keep"``, Q_perm, int32 ``kv_perm``, no walk budget, top-k, dense tail or
tail rank), bf16, head_dim 128, 128 x 128 tiles, 8 warps. The decisions are the library kernel's
(the same per-tile rule on the same m and l); the output may differ by rounding.

    python -m benchmarks.probes.gluon_walk --length 131072 --heads 32/8 --out result.json   # GPU
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = 1.4426950408889634
# Gluon is experimental and renames its builtins: Triton 3.6 (the GPU image) spells these
# async_copy_global_to_shared and thread_barrier, later releases async_load and barrier
_cp_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _issue(k_smem, v_smem, slot, K_head, V_head, KVP_row, j, stride_kl: gl.constexpr,
           stride_vl: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
           load_layout: gl.constexpr):  # fmt: skip
    """cp.async of ranked tile ``j``'s K and V rows (gathered through ``kv_perm``) into ``slot``."""
    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, load_layout))
    idx = gl.load(KVP_row + cols).to(gl.int64)
    offs_d = gl.arange(0, HEAD_D, gl.SliceLayout(0, load_layout))
    _cp_load(k_smem.index(slot),
                                   K_head + idx[:, None] * stride_kl + offs_d[None, :])  # fmt: skip
    _cp_load(v_smem.index(slot),
                                   V_head + idx[:, None] * stride_vl + offs_d[None, :])  # fmt: skip


@gluon.jit
def _walk_kernel(
    Q, K, V, O, QP, KVP, M_buf, L_buf, O_buf, VISITED,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl: gl.constexpr, stride_vb,
    stride_vh, stride_vl: gl.constexpr, stride_pb, stride_ph, stride_pn, L, H, GROUP, S, W,
    N_TILES, qk_scale, tau,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
    EARLY_STOP: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    load_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_D], gl.bfloat16)

    tile = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest walks first
    bh = gl.program_id(1).to(gl.int64)
    h = bh % H
    b = bh // H
    hk = h // GROUP
    a = tile * BLOCK_M
    seg = a // S
    seg_start = seg * S
    P = gl.maximum(seg_start - W, 0)
    n_tiles = P // BLOCK_N

    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_D], smem_l)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_D], smem_l)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, HEAD_D], smem_l)
    K_head = K + b * stride_kb + hk * stride_kh
    V_head = V + b * stride_vb + hk * stride_vh
    KVP_row = KVP + b * stride_pb + h * stride_ph + seg * stride_pn
    for i0 in gl.static_range(STAGES - 1):  # the ring's first tiles, before anything else
        if i0 < n_tiles:
            _issue(k_smem, v_smem, i0, K_head, V_head, KVP_row, i0, stride_kl, stride_vl, BLOCK_N,
                   HEAD_D, load_l)  # fmt: skip
        cp.commit_group()

    # the query rows of this walk tile (Q_perm order) and their Pass-1 state
    slots_q = a + gl.arange(0, BLOCK_M, gl.SliceLayout(1, load_l))
    ok_q = slots_q < gl.minimum(seg_start + S, L)
    pos_q = gl.load(QP + bh * L + slots_q, mask=ok_q, other=0).to(gl.int64)
    offs_dq = gl.arange(0, HEAD_D, gl.SliceLayout(0, load_l))
    q = gl.load(Q + b * stride_qb + h * stride_qh + pos_q[:, None] * stride_ql + offs_dq[None, :],
                mask=ok_q[:, None], other=0.0)  # fmt: skip
    q_smem.store(q)
    slots = a + gl.arange(0, BLOCK_M, rows_l)
    row_ok = slots < gl.minimum(seg_start + S, L)
    pos = gl.load(QP + bh * L + slots, mask=row_ok, other=0).to(gl.int64)
    st = bh * L + pos
    m_i = gl.load(M_buf + st, mask=row_ok, other=0.0)
    l_i = gl.load(L_buf + st, mask=row_ok, other=1.0)
    offs_d = gl.arange(0, HEAD_D, cols_l)
    o1 = gl.load(O_buf + st[:, None] * HEAD_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    acc = o1.to(gl.float32) * l_i[:, None]
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)

    visited = n_tiles * 0
    j = n_tiles * 0
    go = n_tiles > 0
    while go:
        cp.wait_group(STAGES - 2)  # tile j has landed (this thread's copies)
        fence_async_shared()  # cp.async and the Q store go through the generic proxy, wgmma not
        _barrier()  # everyone's copies of tile j; every warp done with tile j - 1's slot
        jn = j + STAGES - 1
        if jn < n_tiles:
            _issue(k_smem, v_smem, jn % STAGES, K_head, V_head, KVP_row, jn, stride_kl,
                   stride_vl, BLOCK_N, HEAD_D, load_l)  # fmt: skip
        cp.commit_group()
        slot = j % STAGES
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero, use_acc=False,
                          is_async=True)  # fmt: skip
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        s = s * qk_scale
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        gain = gl.sum(p, 1)
        l_old = l_i * alpha
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_op), v_smem.index(slot), acc,
                            is_async=True)  # fmt: skip
        l_i = l_old + gain
        m_i = m_new
        visited += 1
        j += 1
        if EARLY_STOP:  # reduced while P V runs: does any row still gain?
            flags = ((gain >= tau * l_old) & row_ok).to(gl.int32)
            go = (gl.max(flags, 0) > 0) & (j < n_tiles)
        else:
            go = j < n_tiles
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    cp.wait_group(0)  # the ring's copies past the stop, before the shared memory goes

    gl.store(VISITED + bh * N_TILES + tile, visited)
    out = acc / l_i[:, None]
    gl.store(O + bh * L * HEAD_D + pos[:, None] * HEAD_D + offs_d[None, :], out.to(gl.bfloat16),
             mask=row_ok[:, None])  # fmt: skip


def gluon_pass2(q, k, v, state, q_perm, kv_perm, *, segment_len, tau, early_stop=None,
                stages=2, block=128):  # fmt: skip
    """``(out, visited)`` as :func:`s2o.kernels.s2o_pass2` in this probe's scope."""
    B, Hq, L, D = q.shape
    if D != 128 or q.dtype != torch.bfloat16 or kv_perm.dtype != torch.int32:
        raise ValueError("the probe takes bf16, head_dim 128 and an int32 kv_perm")
    if segment_len % block or L % block:
        raise ValueError(f"segment_len and L must be multiples of {block}")
    m, l, o1 = state
    out = torch.empty_like(q)
    n_tiles = triton.cdiv(L, block)
    visited = torch.empty(B, Hq, n_tiles, dtype=torch.int32, device=q.device)
    early_stop = tau > 0 if early_stop is None else early_stop
    _walk_kernel[(n_tiles, B * Hq)](
        q, k, v, out, q_perm.contiguous(), kv_perm, m, l, o1, visited,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), kv_perm.stride(0), kv_perm.stride(1),
        kv_perm.stride(2), L, Hq, Hq // k.shape[1], segment_len, 0, n_tiles,
        LOG2E / math.sqrt(D), float(tau), BLOCK_M=block, BLOCK_N=block, HEAD_D=D, STAGES=stages,
        EARLY_STOP=bool(early_stop), num_warps=8,
    )  # fmt: skip
    return out, visited


def main(argv=None) -> dict:
    from benchmarks import common
    from s2o.kernels import WALK_INDEX_DTYPE, s2o_pass1, s2o_pass2, s2o_step1

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--taus", default="0,0.005,0.02")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--rep-ms", type=float, default=400.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    hq, hkv = (int(x) for x in a.heads.split("/"))
    shape = common.Shape(B=1, Hq=hq, Hkv=hkv, D=128, dtype="bfloat16", device="cuda")
    q, k, v = common.make_qkv("synthetic", shape, a.length, 0)
    S = 2048
    geo = dict(segment_len=S, local_window=0, block_m=128, block_n=128)
    perms = s2o_step1(q, k, segment_len=S, index_dtype=WALK_INDEX_DTYPE)
    state = s2o_pass1(q, k, v, **geo)
    bench = common.timer(shape, warmup_ms=50, rep_ms=a.rep_ms)
    rows = []
    for tau in (float(t) for t in a.taus.split(",")):
        for stop in [False, True] if tau <= 0 else [True]:
            ref, ref_vis = s2o_pass2(q, k, v, state, *perms, tau=tau, early_stop=stop, **geo)
            row = {"tau": tau, "stop_logic": stop,
                   "library_ms": bench(lambda t=tau, e=stop: s2o_pass2(
                       q, k, v, state, *perms, tau=t, early_stop=e, **geo))}  # fmt: skip
            for st in (int(x) for x in a.stages.split(",")):
                try:
                    out, vis = gluon_pass2(q, k, v, state, *perms, segment_len=S, tau=tau,
                                           early_stop=stop, stages=st)  # fmt: skip
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs()
                    row[f"gluon{st}"] = {
                        "ms": bench(lambda t=tau, e=stop, s=st: gluon_pass2(
                            q, k, v, state, *perms, segment_len=S, tau=t, early_stop=e,
                            stages=s)),
                        "same_visits": bool(torch.equal(vis, ref_vis)),
                        "visits": int(vis.sum()), "library_visits": int(ref_vis.sum()),
                        "max_abs_diff": float(err.max()), "mean_abs_diff": float(err.mean()),
                    }  # fmt: skip
                except Exception as e:  # compile or launch failure: recorded, the rest goes on
                    row[f"gluon{st}"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"length": a.length, "heads": a.heads, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "rows": rows}  # fmt: skip
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
