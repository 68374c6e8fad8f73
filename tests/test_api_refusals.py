"""The library refuses inputs that used to give silently wrong numbers or late, unnamed errors.

Each test uses the input the fuzz campaign or the new-user trial reported.
"""

from __future__ import annotations

import pytest
import torch

from s2o import METHODS, s2o_attention, sparse_attention
from s2o.methods import bind

SMALL = dict(segment_len=32, block_m=16, block_n=16)


def qkv(B=1, Hq=4, Hkv=2, L=64, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(B, h, L, D, generator=g).to(dtype) for h in (Hq, Hkv, Hkv)
    )  # fmt: skip


def method_knobs(name: str) -> dict:
    """Knobs that make every method valid on the small inputs of this file."""
    return {
        "s2o": SMALL,
        "full": {},
        "flexprefill": dict(block_size=16, min_budget=16),
        "flashprefill": dict(block_size=16, alpha=0.1),
        "xattn": dict(block_size=16, stride=4),
        "pbs": dict(block_size=16, segment_size=32),
    }[name]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_are_refused_naming_tensor_and_position(method, where, bad):
    """Was: the baselines returned exact zeros for the affected rows, with no error."""
    q, k, v = qkv()
    t = {"q": q, "k": k, "v": v}[where]
    t[0, 1, 37, 5] = bad
    with pytest.raises(ValueError, match=rf"{where} has a non-finite value.*\[0, 1, 37, 5\]"):
        sparse_attention(method, q, k, v, **method_knobs(method))


def test_full_nan_in_last_key_is_refused_not_spread_to_row_0():
    """Was (CPU, math SDPA): a NaN in the last key made row 0 NaN although row 0 cannot see it."""
    q, k, v = qkv()
    k[:, :, -1] = float("nan")
    with pytest.raises(ValueError, match=r"k has a non-finite value.*\[0, 0, 63, 0\]"):
        sparse_attention("full", q, k, v)
    with pytest.raises(ValueError, match=r"k has a non-finite value"):
        s2o_attention(q, k, v, **SMALL)


def test_inputs_requiring_grad_are_refused_as_inference_only():
    q, k, v = qkv()
    q.requires_grad_(True)
    with pytest.raises(ValueError, match=r"q requires grad.*inference-only.*torch.no_grad"):
        s2o_attention(q, k, v, **SMALL)
    with pytest.raises(ValueError, match=r"inference-only"):
        sparse_attention("flexprefill", q, k, v, **method_knobs("flexprefill"))
    with torch.no_grad():
        s2o_attention(q, k, v, **SMALL)  # fine without a gradient request


@pytest.mark.interpreter
def test_bf16_under_the_triton_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = qkv(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"bfloat16.*interpreter.*tl.dot"):
        s2o_attention(q, k, v, impl="triton", **SMALL)
    with pytest.raises(ValueError, match=r"bfloat16.*interpreter"):
        sparse_attention("xattn", q, k, v, impl="triton", **method_knobs("xattn"))
    s2o_attention(q, k, v, impl="reference", **SMALL)  # the reference handles bf16 on the CPU


def test_xattn_threshold_one_is_dense_on_peaked_fp16():
    """Was: blocks whose estimated mass underflowed to 0 were never selected (sparsity 0.167)."""
    g = torch.Generator().manual_seed(4)  # a seed where two blocks underflow
    q = (12 * torch.randn(1, 1, 48, 16, generator=g)).half()
    k = (12 * torch.randn(1, 1, 48, 16, generator=g)).half()
    v = torch.randn(1, 1, 48, 16, generator=g).half()
    out, stats = sparse_attention("xattn", q, k, v, threshold=1.0, block_size=16, stride=4)
    full, _ = sparse_attention("full", q.float(), k.float(), v.float())
    assert stats.sparsity == 0.0, stats.sparsity
    err = (out.float() - full).abs().max().item()
    assert err < 1e-2, f"threshold=1.0 must be dense attention, max error {err}"


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
def test_full_refuses_a_bad_scale(scale):
    with pytest.raises(ValueError, match=r"scale"):
        sparse_attention("full", *qkv(), scale=scale)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize(
    "shape", [(1, 0, 2, 64, 16), (0, 4, 2, 64, 16), (1, 4, 2, 0, 16), (1, 4, 2, 64, 0)]
)
def test_any_zero_dimension_is_refused(method, shape):
    """Was: Hq=0 passed; S2O reported sparsity nan, FlexPrefill and PBS crashed in a reshape."""
    B, Hq, Hkv, L, D = shape
    q, k, v = torch.randn(B, Hq, L, D), torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    with pytest.raises(ValueError, match=r"empty input.*zero dimension"):
        sparse_attention(method, q, k, v, **method_knobs(method))


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_full_gpu_backends_on_cpu_name_knob_and_device(backend):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU case")
    with pytest.raises(ValueError, match=rf"backend='{backend}' needs CUDA tensors.*cpu"):
        sparse_attention("full", *qkv(), backend=backend)


def test_full_flash_on_non_contiguous_last_dim_names_the_layout():
    q, k, v = qkv()
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, last-dim stride 64
    with pytest.raises(ValueError, match=r"backend='flash'.*contiguous last dimension.*'q': 64"):
        sparse_attention("full", qt, k, v, backend="flash")
    out, _ = sparse_attention("full", qt, k, v, backend="math")
    assert torch.allclose(out, sparse_attention("full", q, k, v)[0], atol=1e-6)


@pytest.mark.parametrize("knob", ["block_m", "block_n"])
def test_s2o_non_power_of_two_tiles_are_refused_naming_the_knob(knob):
    with pytest.raises(ValueError, match=rf"{knob}=48 must be a power of two"):
        s2o_attention(*qkv(L=96), segment_len=96, **{"block_m": 16, "block_n": 16, knob: 48})


@pytest.mark.parametrize("method", ["flexprefill", "flashprefill", "xattn", "pbs"])
def test_block_sparse_non_power_of_two_block_size_is_refused(method):
    knobs = {**method_knobs(method), "block_size": 24}
    if method == "pbs":
        knobs["segment_size"] = 48
    if method == "xattn":
        knobs["stride"] = 8
    with pytest.raises(ValueError, match=r"block_size=24 must be a power of two"):
        sparse_attention(method, *qkv(), **knobs)


def test_method_name_must_be_a_string():
    with pytest.raises(ValueError, match=r"method must be a str.*\['s2o'\]"):
        sparse_attention(["s2o"], *qkv())


@pytest.mark.parametrize("value", ["no", 1, None])
def test_return_stats_must_be_a_bool(value):
    with pytest.raises(ValueError, match=r"return_stats must be a bool"):
        s2o_attention(*qkv(), return_stats=value, **SMALL)


# --- one validation for every method: scale, tile sizes, meta tensors, Step-1 sort -------------

BAD_SCALES = [0.0, -1.0, -0.0, float("nan"), float("inf")]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("scale", BAD_SCALES)
def test_every_method_refuses_the_scales_full_refuses(method, scale):
    """Was: S2O ran with scale=0 and scale=-1 (uniform or inverted scores); Full refused them."""
    with pytest.raises(ValueError, match=r"scale must be a finite number"):
        sparse_attention(method, *qkv(), scale=scale, **method_knobs(method))


@pytest.mark.parametrize("scale", BAD_SCALES)
def test_s2o_attention_and_a_per_call_scale_refuse_a_bad_scale(scale):
    with pytest.raises(ValueError, match=r"scale must be a finite number"):
        s2o_attention(*qkv(), scale=scale, **SMALL)
    bound = bind("s2o", **SMALL)
    with pytest.raises(ValueError, match=r"scale must be a finite number"):
        bound(*qkv(), scale=scale)


HUGE = 2**40


@pytest.mark.parametrize(
    "method, knobs, name",
    [("s2o", dict(segment_len=HUGE, block_m=HUGE, block_n=HUGE), "block_m"),
     ("s2o", dict(segment_len=HUGE, block_m=16, block_n=HUGE), "block_n"),
     ("full", dict(block_m=HUGE), "block_m"), ("full", dict(block_n=HUGE), "block_n"),
     ("flexprefill", dict(block_size=HUGE), "block_size"),
     ("flashprefill", dict(block_size=HUGE, alpha=0.1), "block_size"),
     ("xattn", dict(block_size=HUGE), "block_size"),
     ("pbs", dict(block_size=HUGE, segment_size=2 * HUGE), "block_size")],
)  # fmt: skip
def test_huge_tile_sizes_are_refused_before_any_allocation(method, knobs, name):
    """Was: 2**40 reached the allocator (S2O, XAttention, PBS) or passed (Full, FlexPrefill)."""
    with pytest.raises(ValueError, match=rf"{name}={HUGE} is larger than the largest tile size"):
        sparse_attention(method, *qkv(), **knobs)
    from s2o.validation import MAX_TILE

    assert MAX_TILE == 1024
    sparse_attention("full", *qkv(), block_m=1024, block_n=1024)  # the bound itself passes


@pytest.mark.parametrize("method", sorted(METHODS))
def test_meta_tensors_are_refused(method):
    """Was: Full, FlexPrefill, XAttention and PBS returned meta outputs; S2O failed in .item()."""
    q, k, v = (t.to("meta") for t in qkv())
    with pytest.raises(ValueError, match=r"'meta' device"):
        sparse_attention(method, q, k, v, **method_knobs(method))
    with pytest.raises(ValueError, match=r"'meta' device"):
        bind(method, **method_knobs(method))(q, k, v)


def test_s2o_attention_refuses_meta_tensors():
    q, k, v = (t.to("meta") for t in qkv())
    with pytest.raises(ValueError, match=r"'meta' device"):
        s2o_attention(q, k, v, **SMALL)


def test_step1_sort_cub_on_the_reference_path_is_refused():
    """Was: step1_sort='cub' ran the reference's own sort, silently."""
    with pytest.raises(ValueError, match=r"step1_sort='cub'.*'reference'"):
        bind("s2o", impl="reference", step1_sort="cub", **SMALL)
    if not torch.cuda.is_available():
        bound = bind("s2o", step1_sort="cub", **SMALL)  # impl=auto: decided per device
        with pytest.raises(ValueError, match=r"step1_sort='cub'.*'reference'"):
            bound(*qkv())
    for sort in ("chunks", "full"):  # the reference's sort stands for these
        sparse_attention("s2o", *qkv(), impl="reference", step1_sort=sort, **SMALL)
