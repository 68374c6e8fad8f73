"""CUB's device-wide radix sorts for Step 1's ``sort_mode="cub"``: rank many rows of keys at once.

``torch.sort`` has no key-only or bit-range interface: it always moves int64 indices and all key
bits, and its segmented sort runs one thread block per row. Here every row of a group of segments
is ranked with two stable device-wide LSD radix sorts (CUB's onesweep):

1. pairs (uint32 score key, uint32 ``row << pos_bits | position``), all 32 key bits (4 passes);
2. keys only: the values of 1, over their row bits only (1 pass for up to 256 rows).

Sort 2 is stable, so every row ends up contiguous in row order with the order of sort 1 inside:
descending score, ties in ascending position. About 80 bytes move per key instead of ~110 for
``torch.sort`` (or ~130 for one sort of 64-bit (row, score) keys).

With ``score_bits < 32`` (Step 1's ``score_bits``: the ranking keeps only the top bits of each
score's order-preserving image) the row fits beside the score in one uint32 key, ``row <<
score_bits | top bits``, and one stable sort of pairs over ``score_bits + row_bits`` bits ranks
every row at once (3 passes for 16 bits and up to 256 rows, instead of 4 + 1).

CUB is header-only and ships with the CUDA toolkit; the extension is compiled on first use with
``torch.utils.cpp_extension.load_inline`` (needs ``nvcc`` and ``ninja``; about a minute, then
cached). Without a CUDA compiler, :func:`rank_rows` raises: there is no silent fallback.
"""

from __future__ import annotations

import functools

import torch

_CUDA_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

// both calls: temp == nullptr asks for the temporary storage size
size_t s2o_cub_pairs(void* temp, size_t bytes, const unsigned* k_in, unsigned* k_out,
                     const unsigned* v_in, unsigned* v_out, int64_t n, int end_bit,
                     cudaStream_t s) {
  cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, v_in, v_out, n, 0, end_bit, s);
  return bytes;
}

size_t s2o_cub_keys(void* temp, size_t bytes, const unsigned* k_in, unsigned* k_out, int64_t n,
                    int begin_bit, int end_bit, cudaStream_t s) {
  cub::DeviceRadixSort::SortKeys(temp, bytes, k_in, k_out, n, begin_bit, end_bit, s);
  return bytes;
}
"""

_CPP_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

size_t s2o_cub_pairs(void* temp, size_t bytes, const unsigned* k_in, unsigned* k_out,
                     const unsigned* v_in, unsigned* v_out, int64_t n, int end_bit,
                     cudaStream_t s);
size_t s2o_cub_keys(void* temp, size_t bytes, const unsigned* k_in, unsigned* k_out, int64_t n,
                    int begin_bit, int end_bit, cudaStream_t s);

static const unsigned* cu(const torch::Tensor& t) { return (const unsigned*)t.data_ptr<int>(); }
static unsigned* mu(torch::Tensor& t) { return (unsigned*)t.data_ptr<int>(); }

// keys, vals: int32 CUDA tensors holding uint32; returns the values ranked as described above
torch::Tensor rank_rows(torch::Tensor keys, torch::Tensor vals, int64_t pos_bits,
                        int64_t row_bits) {
  TORCH_CHECK(keys.is_cuda() && keys.is_contiguous() && vals.is_contiguous());
  TORCH_CHECK(keys.scalar_type() == torch::kInt32 && vals.scalar_type() == torch::kInt32);
  const int64_t n = keys.numel();
  auto s = c10::cuda::getCurrentCUDAStream().stream();
  auto k_out = torch::empty_like(keys), v_out = torch::empty_like(vals);
  auto out = torch::empty_like(vals);
  const int lo = (int)pos_bits, hi = (int)(pos_bits + row_bits);
  size_t b1 = s2o_cub_pairs(nullptr, 0, cu(keys), mu(k_out), cu(vals), mu(v_out), n, 32, s);
  size_t b2 = s2o_cub_keys(nullptr, 0, cu(v_out), mu(out), n, lo, hi, s);
  auto temp = torch::empty({(int64_t)std::max(b1, b2) + 1}, keys.options().dtype(torch::kUInt8));
  s2o_cub_pairs(temp.data_ptr(), b1, cu(keys), mu(k_out), cu(vals), mu(v_out), n, 32, s);
  s2o_cub_keys(temp.data_ptr(), b2, cu(v_out), mu(out), n, lo, hi, s);
  return out;
}

// one stable sort of pairs by the low end_bit bits of keys; returns the values in that order
torch::Tensor sort_pairs(torch::Tensor keys, torch::Tensor vals, int64_t end_bit) {
  TORCH_CHECK(keys.is_cuda() && keys.is_contiguous() && vals.is_contiguous());
  TORCH_CHECK(keys.scalar_type() == torch::kInt32 && vals.scalar_type() == torch::kInt32);
  const int64_t n = keys.numel();
  auto s = c10::cuda::getCurrentCUDAStream().stream();
  auto k_out = torch::empty_like(keys), v_out = torch::empty_like(vals);
  const int hi = (int)end_bit;
  size_t b = s2o_cub_pairs(nullptr, 0, cu(keys), mu(k_out), cu(vals), mu(v_out), n, hi, s);
  auto temp = torch::empty({(int64_t)b + 1}, keys.options().dtype(torch::kUInt8));
  s2o_cub_pairs(temp.data_ptr(), b, cu(keys), mu(k_out), cu(vals), mu(v_out), n, hi, s);
  return v_out;
}
"""


@functools.cache
def _extension():
    from torch.utils.cpp_extension import load_inline

    try:
        return load_inline(
            name="s2o_cub_rank", cpp_sources=_CPP_SRC, cuda_sources=_CUDA_SRC,
            functions=["rank_rows", "sort_pairs"], extra_cuda_cflags=["-O3"], verbose=False,
        )  # fmt: skip
    except Exception as e:  # no nvcc / ninja, or a compiler error: say so, never fall back
        raise RuntimeError(
            "sort_mode='cub' compiles a CUB extension on first use and needs nvcc and ninja; "
            f"building it failed: {type(e).__name__}: {e}"
        ) from e


def rank_rows(
    keys: torch.Tensor, vals: torch.Tensor, pos_bits: int, row_bits: int, score_bits: int = 32
) -> torch.Tensor:
    """Rank ``vals`` (int32 ``row << pos_bits | position``, rows back to back in ascending row
    order) by ascending uint32 ``keys`` (int32 storage) inside each row, stably; returns the
    values in that order. ``score_bits < 32``: the keys are ``row << score_bits | top score
    bits`` and one sort over their ``score_bits + row_bits`` bits ranks them. CPU tensors take
    ``torch.sort`` (the same order) so that the Triton kernels around it can be tested under the
    interpreter."""
    if pos_bits + row_bits > 32:
        raise ValueError(f"sort_mode='cub' packs row and position into 32 bits, needs "
                         f"{pos_bits} + {row_bits}; use sort_mode='chunks'")  # fmt: skip
    if score_bits < 32 and score_bits + row_bits > 32:
        raise ValueError(f"score_bits={score_bits} packs the row beside the score in 32 bits, "
                         f"needs {score_bits} + {row_bits}")  # fmt: skip
    if not keys.is_cuda:
        unsigned = keys.long() & 0xFFFFFFFF
        by_key = vals[torch.sort(unsigned, stable=True).indices]
        if score_bits < 32:
            return by_key
        row = (by_key.long() & 0xFFFFFFFF) >> pos_bits
        return by_key[torch.sort(row, stable=True).indices]
    if score_bits < 32:
        return _extension().sort_pairs(keys, vals, score_bits + row_bits)
    return _extension().rank_rows(keys, vals, pos_bits, row_bits)
