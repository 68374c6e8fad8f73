# ruff: noqa  (the lab script as it ran on the GPU, kept beside its records; not project code)
"""Micro-benchmark: the plain ranked walk as one 128-row product chain vs two 64-row halves
(PV of half A in flight while half B's softmax runs), gathered K/V through a random int32 index;
and Step 1's sort modes at 128K."""

import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))


@triton.jit
def _ld(K_head, V_head, KVP_row, start, P, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr):
    cols = start + tl.arange(0, BLOCK_N)
    ok = cols < P
    idx = tl.load(KVP_row + cols, mask=ok, other=0).to(tl.int64)
    offs_d = tl.arange(0, HEAD_D)
    k = tl.load(K_head + idx[:, None] * HEAD_D + offs_d[None, :], mask=ok[:, None], other=0.0)
    v = tl.load(V_head + idx[:, None] * HEAD_D + offs_d[None, :], mask=ok[:, None], other=0.0)
    return k, v


@triton.jit
def base_kernel(
    Q,
    K,
    V,
    KVP,
    O,
    L,
    P,
    GROUP,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    offs_m = t * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    q = tl.load(Q + h * L * HEAD_D + offs_m[:, None] * HEAD_D + offs_d[None, :])
    Kh = K + (h // GROUP) * L * HEAD_D
    Vh = V + (h // GROUP) * L * HEAD_D
    R = KVP + h * P
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    for j in range(0, tl.cdiv(P, BLOCK_N)):
        k, v = _ld(Kh, Vh, R, j * BLOCK_N, P, BLOCK_N, HEAD_D)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    tl.store(
        O + h * L * HEAD_D + offs_m[:, None] * HEAD_D + offs_d[None, :],
        (acc / l_i[:, None]).to(O.dtype.element_ty),
    )


@triton.jit
def halves_kernel(
    Q,
    K,
    V,
    KVP,
    O,
    L,
    P,
    GROUP,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
):
    HM: tl.constexpr = BLOCK_M // 2
    t = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    offs_h = t * BLOCK_M + tl.arange(0, HM)
    offs_d = tl.arange(0, HEAD_D)
    qa = tl.load(Q + h * L * HEAD_D + offs_h[:, None] * HEAD_D + offs_d[None, :])
    qb = tl.load(Q + h * L * HEAD_D + (HM + offs_h)[:, None] * HEAD_D + offs_d[None, :])
    Kh = K + (h // GROUP) * L * HEAD_D
    Vh = V + (h // GROUP) * L * HEAD_D
    R = KVP + h * P
    ma = tl.full([HM], float("-inf"), tl.float32)
    la = tl.zeros([HM], tl.float32)
    mb = tl.full([HM], float("-inf"), tl.float32)
    lb = tl.zeros([HM], tl.float32)
    acca = tl.zeros([HM, HEAD_D], tl.float32)
    accb = tl.zeros([HM, HEAD_D], tl.float32)
    for j in range(0, tl.cdiv(P, BLOCK_N)):
        k, v = _ld(Kh, Vh, R, j * BLOCK_N, P, BLOCK_N, HEAD_D)
        kt = tl.trans(k)
        sa = tl.dot(qa, kt) * qk_scale
        sb = tl.dot(qb, kt) * qk_scale
        mna = tl.maximum(ma, tl.max(sa, 1))
        pa = tl.math.exp2(sa - mna[:, None])
        aa = tl.math.exp2(ma - mna)
        acca = tl.dot(pa.to(v.dtype), v, acca * aa[:, None])
        la = la * aa + tl.sum(pa, 1)
        ma = mna
        mnb = tl.maximum(mb, tl.max(sb, 1))
        pb = tl.math.exp2(sb - mnb[:, None])
        ab = tl.math.exp2(mb - mnb)
        accb = tl.dot(pb.to(v.dtype), v, accb * ab[:, None])
        lb = lb * ab + tl.sum(pb, 1)
        mb = mnb
    tl.store(
        O + h * L * HEAD_D + offs_h[:, None] * HEAD_D + offs_d[None, :],
        (acca / la[:, None]).to(O.dtype.element_ty),
    )
    tl.store(
        O + h * L * HEAD_D + (HM + offs_h)[:, None] * HEAD_D + offs_d[None, :],
        (accb / lb[:, None]).to(O.dtype.element_ty),
    )


def main():
    out = open(os.environ.get("OUT", "/tmp") + "/micro.jsonl", "a")

    def emit(**r):
        out.write(json.dumps(r) + "\n")
        out.flush()
        print(json.dumps(r), flush=True)

    from triton.testing import do_bench

    torch.manual_seed(0)
    H, G, L, D, P = 32, 4, 32768, 128, 32768
    q = torch.randn(H, L, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(H // G, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kvp = (
        torch.stack([torch.randperm(L, device="cuda")[:P] for _ in range(H)])
        .to(torch.int32)
        .contiguous()
    )
    scale = D**-0.5 * 1.4426950408889634
    ref = None
    for name, fn in (("base", base_kernel), ("halves", halves_kernel)):
        for BN, W, ST in ((128, 8, 3), (128, 8, 5), (64, 8, 4), (64, 8, 6), (64, 4, 3)):
            o = torch.full_like(q, float("nan"))
            try:
                run = lambda: fn[(L // 128, H)](
                    q,
                    k,
                    v,
                    kvp,
                    o,
                    L,
                    P,
                    G,
                    scale,
                    BLOCK_M=128,
                    BLOCK_N=BN,
                    HEAD_D=D,
                    num_warps=W,
                    num_stages=ST,
                )
                run()
                torch.cuda.synchronize()
                ms = do_bench(run, warmup=50, rep=400, return_mode="median")
            except Exception as e:
                emit(kernel=name, BN=BN, warps=W, stages=ST, error=str(e)[:200])
                continue
            if ref is None:
                ref = o.float().clone()
            err = float((o.float() - ref).norm() / ref.norm())
            flops = 4.0 * 128 * P * D * (L // 128) * H
            emit(
                kernel=name,
                BN=BN,
                warps=W,
                stages=ST,
                ms=ms,
                tflops=flops / ms / 1e9,
                rel_err_vs_first=err,
            )
    # Step 1 sort modes at 128K on random Q/K (sort time does not depend on the order of values much)
    sys.path.insert(0, os.path.abspath("local/gpu/tree"))
    from s2o.kernels import s2o_step1

    for hq, hkv in ((12, 2), (32, 8)):
        qq = torch.randn(1, hq, 131072, D, device="cuda", dtype=torch.bfloat16)
        kk = torch.randn(1, hkv, 131072, D, device="cuda", dtype=torch.bfloat16)
        for mode in ("chunks", "cub"):
            try:
                t0 = time.time()
                a = s2o_step1(qq, kk, segment_len=2048, sort_mode=mode, index_dtype=torch.int32)
                torch.cuda.synchronize()
                first = time.time() - t0
                ms = do_bench(
                    lambda: s2o_step1(
                        qq, kk, segment_len=2048, sort_mode=mode, index_dtype=torch.int32
                    ),
                    warmup=50,
                    rep=400,
                    return_mode="median",
                )
                emit(
                    part="step1",
                    heads=f"{hq}/{hkv}",
                    sort=mode,
                    ms=ms,
                    first_call_s=round(first, 1),
                )
            except Exception as e:
                emit(part="step1", heads=f"{hq}/{hkv}", sort=mode, error=str(e)[:300])
        del qq, kk


if __name__ == "__main__":
    main()
