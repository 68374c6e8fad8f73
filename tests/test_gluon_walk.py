"""The Gluon walk's scope, its dispatch and its compilation for Hopper, on the CPU.

Whether it computes what the Triton walk computes is a GPU test
(``tests/test_kernels_gpu.py::test_gpu_gluon_walk_equals_triton_walk``): Gluon has no
interpreter. Here: which calls it takes (and the reason it gives for the others), that it runs
by default wherever its scope takes the call and never where ``walk='triton'``, that asking for
it outside its scope is refused with that reason, and that the kernel compiles for sm_90 with
the installed Triton within the shared memory of an H100/H200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

gluon_walk = pytest.importorskip("s2o.kernels.gluon_walk")

from s2o.kernels import Launch, s2o_pass2  # noqa: E402
from s2o.kernels.launch import WALKS, resolve_launch  # noqa: E402
from s2o.kernels.s2o_attention import _gluon_walk  # noqa: E402
from s2o.methods import launch_knob  # noqa: E402

SCOPE = dict(capability=(9, 0), dtype=torch.bfloat16, head_d=128, block_m=128, block_n=128,
             even=True, keep=True, use_qperm=True, gather=True, kv_dtype=torch.int32,
             dense_tail=0, tail_rank=0, launch=None)  # fmt: skip
QKV = tuple(torch.zeros(1, 2, 256, 128) for _ in range(3))


def test_the_default_configuration_is_in_scope():
    assert gluon_walk.unsupported(**SCOPE) is None


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"capability": None}, "sm_90"),
        ({"capability": (8, 0)}, "sm_90"),
        ({"capability": (10, 0)}, "sm_90"),
        ({"dtype": torch.float32}, "bf16 or fp16"),
        ({"head_d": 64}, "head_dim 128"),
        ({"block_m": 64}, "128 x 128"),
        ({"even": False}, "every ranked tile full"),
        ({"keep": False}, "stop_tile='keep'"),
        ({"use_qperm": False}, "Q_perm"),
        ({"gather": False}, "gathered"),
        ({"kv_dtype": torch.int64}, "int32 kv_perm"),
        ({"dense_tail": 128}, "dense_tail"),
        ({"tail_rank": 128}, "tail_rank"),
        ({"launch": Launch(num_warps=4)}, "num_warps=4"),
        ({"launch": Launch(sub_n=64)}, "sub_n=64"),
        ({"launch": Launch(num_stages=5)}, "num_stages=5"),
        ({"aligned": False}, "16 bytes"),
    ],
)
def test_every_call_outside_the_scope_names_its_reason(change, reason):
    got = gluon_walk.unsupported(**{**SCOPE, **change})
    assert got is not None and reason in got


@pytest.mark.parametrize("stages", gluon_walk.STAGES)
def test_ring_sizes_and_the_default_launch_are_in_scope(stages):
    assert gluon_walk.unsupported(**{**SCOPE, "launch": Launch(num_stages=stages)}) is None
    assert gluon_walk.unsupported(**{**SCOPE, "launch": Launch(num_warps=8, sub_n=128)}) is None


def test_alignment_of_views():
    x = torch.zeros(1, 2, 256, 128)
    assert gluon_walk.aligned(x, x, x)
    shifted = torch.zeros(2 * 256 * 128 + 8)[8:].view(1, 2, 256, 128)  # starts 32 bytes in
    assert gluon_walk.aligned(shifted)
    odd = torch.zeros(2 * 256 * 128 + 1)[1:].view(1, 2, 256, 128)  # starts 4 bytes in
    assert not gluon_walk.aligned(odd)
    narrow = torch.zeros(1, 2, 256, 136)[..., :128]  # rows 136 elements apart
    assert not gluon_walk.aligned(narrow)


def test_the_gluon_walk_is_the_default_in_its_scope_and_triton_walks_when_asked():
    def scope(**change):
        return lambda: {**SCOPE, **change}

    assert _gluon_walk(None, scope(), QKV)
    assert _gluon_walk(Launch(), scope(), QKV)
    assert _gluon_walk(Launch(walk="gluon"), scope(), QKV)
    assert _gluon_walk(Launch(walk="gluon", num_stages=3), scope(), QKV)
    assert not _gluon_walk(Launch(walk="triton"), scope(), QKV)
    # out of its scope the default is the Triton walk: off Hopper, head_dim 64, 4 warps
    assert not _gluon_walk(None, scope(capability=None), QKV)
    assert not _gluon_walk(None, scope(head_d=64), QKV)
    assert not _gluon_walk(Launch(num_warps=4), scope(launch=Launch(num_warps=4)), QKV)

    def never():
        raise AssertionError("walk='triton' needs no scope")

    assert not _gluon_walk(Launch(walk="triton"), never, QKV)


def test_asking_for_the_gluon_walk_outside_its_scope_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="walk='gluon'.*head_dim 128"):
        _gluon_walk(Launch(walk="gluon"), lambda: {**SCOPE, "head_d": 64}, QKV)


def test_pass2_on_the_cpu_refuses_the_gluon_walk_before_any_work():
    L, S = 256, 128
    q = k = v = torch.zeros(1, 1, L, 128)
    state = (torch.zeros(1, L), torch.ones(1, L), torch.zeros(1, L, 128))
    q_perm = torch.arange(L).view(1, 1, L)
    kv_perm = torch.zeros(1, 1, 2, L, dtype=torch.int32)
    with pytest.raises(ValueError, match="walk='gluon'.*sm_90"):
        s2o_pass2(q, k, v, state, q_perm, kv_perm, segment_len=S, local_window=0, block_m=128,
                  block_n=128, tau=0.01, launch=Launch(walk="gluon"))  # fmt: skip


def test_walk_is_a_pass2_setting_with_two_values():
    assert launch_knob.WALKS == WALKS
    with pytest.raises(ValueError, match="pass1: walk='gluon' is a Pass-2 setting"):
        resolve_launch("pass1", Launch(walk="gluon"), head_d=128, block_n=128,
                       device=torch.device("cpu"))  # fmt: skip
    with pytest.raises(ValueError, match="walk='cuda'"):
        resolve_launch("pass2", Launch(walk="cuda"), head_d=128, block_n=128,
                       device=torch.device("cpu"))  # fmt: skip
    launch_knob.check_per_kernel({"pass2": {"walk": "gluon", "num_stages": 3}}, ("pass1", "pass2"))
    with pytest.raises(ValueError, match="launch.pass1: walk is a setting of S2O's pass2 only"):
        launch_knob.check_per_kernel({"pass1": {"walk": "gluon"}}, ("pass1", "pass2"))
    with pytest.raises(ValueError, match=r"launch.pass2.walk must be one of \['triton', 'gluon'\]"):
        launch_knob.check_per_kernel({"pass2": {"walk": "cuda"}}, ("pass1", "pass2"))
    with pytest.raises(ValueError, match="walk is a setting of S2O's pass2 only"):
        launch_knob.check_settings("launch", {"walk": "gluon"})  # FlashPrefill's kernel
    assert launch_knob.to_launch({"walk": "triton"}) == Launch(walk="triton")


COMPILE = """
import json, os, re, subprocess, sys, tempfile
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import compile as triton_compile
from triton.experimental.gluon._runtime import GluonASTSource
from s2o.kernels.gluon_walk import _s2o_pass2_gluon_kernel as fn

out = []
for ring, early_stop, dtype in json.loads(sys.argv[1]):
    names = fn.arg_names
    ptrs = {"Q": dtype, "K": dtype, "V": dtype, "O": dtype, "QP": "i32", "KVP": "i32",
            "M_buf": "fp32", "L_buf": "fp32", "O_buf": dtype, "VISITED": "i32"}
    const = {"stride_kl": 128, "stride_vl": 128, "BLOCK_M": 128, "BLOCK_N": 128, "HEAD": 128,
             "RING": ring, "EARLY_STOP": early_stop, "num_warps": 8}
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in ptrs:
            sig[n] = "*" + ptrs[n]
        elif n in const:
            sig[n] = "constexpr"
        elif n in ("qk_scale", "tau"):
            sig[n] = "fp32"
        else:
            sig[n] = "i64" if n.startswith("stride") else "i32"
        if n in ptrs or (n.startswith("stride") and n not in const):
            attrs[(i,)] = [["tt.divisibility", 16]]  # what Triton's launcher specializes
    src = GluonASTSource(fn, sig, {(names.index(n),): v for n, v in const.items()}, attrs)
    kernel = triton_compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    # ptxas -v on the kernel's PTX (the ptxas Triton compiles sm_90 with): registers, spills
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "walk.ptx")
        open(ptx, "w").write(kernel.asm["ptx"])
        try:
            ptxas = get_ptxas(90).path
        except TypeError:  # Triton 3.5: one ptxas for every arch
            ptxas = get_ptxas().path
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o",
                               os.path.join(tmp, "walk.cubin")], capture_output=True, text=True)
    text = info.stdout + info.stderr
    regs = int(re.search(r"Used (\\d+) registers", text).group(1))
    spills = [int(x) for x in re.findall(r"(\\d+) bytes spill", text)]
    out.append([kernel.metadata.shared, regs, sum(spills)])
print(json.dumps(out))
"""


def test_the_kernel_compiles_for_sm90_within_hopper_shared_memory():
    """Gluon is experimental and renames its builtins between Triton releases: the kernel must
    compile for sm_90 with the installed Triton (outside the interpreter the other tests run
    under), within the 227 KiB a Hopper block may take, the largest ring included, and without
    spilling registers (ptxas -v on its PTX: a spill in the walk's loop costs more than any of
    its reorders gained or lost on an H200)."""
    configs = [[3, True, "bf16"], [3, False, "fp16"]]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(configs)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(stats) == 2
    for shared, regs, spilled in stats:
        assert 0 < shared <= 227 * 1024 and 0 < regs <= 255 and spilled == 0, stats
