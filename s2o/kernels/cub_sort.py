"""CUB's device-wide radix sort of (uint64 key, int32 value) pairs over a bit range, for Step 1's
``sort_mode="cub"``.

``torch.sort`` has no key-only or bit-range interface: it always moves int64 indices and all key
bits. Step 1 packs (row, score) into 32 + log2(rows) bits, so a sort over just those bits with an
int32 payload moves fewer bytes. CUB is header-only and ships with the CUDA toolkit; the extension
is compiled on first use with ``torch.utils.cpp_extension.load_inline`` (needs ``nvcc`` and
``ninja``; about a minute, then cached). Without a CUDA compiler, :func:`sort_pairs` raises.
"""

from __future__ import annotations

import functools

import torch

_CUDA_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

size_t s2o_cub_temp_bytes(int64_t n, int end_bit) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const unsigned long long*)nullptr,
                                  (unsigned long long*)nullptr, (const int*)nullptr, (int*)nullptr,
                                  n, 0, end_bit);
  return bytes;
}

void s2o_cub_sort_pairs(void* temp, size_t bytes, const void* keys_in, void* keys_out,
                        const int* vals_in, int* vals_out, int64_t n, int end_bit,
                        cudaStream_t stream) {
  cub::DeviceRadixSort::SortPairs(temp, bytes, (const unsigned long long*)keys_in,
                                  (unsigned long long*)keys_out, vals_in, vals_out, n, 0, end_bit,
                                  stream);
}

// segmented: uint32 keys, int32 values, rows [off[i], off[i+1]); algo 0 = radix, 1 = merge-based
size_t s2o_cub_seg(void* temp, size_t bytes, const void* keys_in, void* keys_out,
                   const int* vals_in, int* vals_out, int64_t n, int64_t rows,
                   const int64_t* off, int algo, cudaStream_t stream) {
  auto ki = (const unsigned int*)keys_in;
  auto ko = (unsigned int*)keys_out;
  if (algo == 0) {
    cub::DeviceSegmentedRadixSort::SortPairs(temp, bytes, ki, ko, vals_in, vals_out, n, rows,
                                             off, off + 1, 0, 32, stream);
  } else {
    cub::DeviceSegmentedSort::StableSortPairs(temp, bytes, ki, ko, vals_in, vals_out, n, rows,
                                              off, off + 1, stream);
  }
  return bytes;
}
"""

_CPP_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

size_t s2o_cub_temp_bytes(int64_t n, int end_bit);
void s2o_cub_sort_pairs(void* temp, size_t bytes, const void* keys_in, void* keys_out,
                        const int* vals_in, int* vals_out, int64_t n, int end_bit,
                        cudaStream_t stream);
size_t s2o_cub_seg(void* temp, size_t bytes, const void* keys_in, void* keys_out,
                   const int* vals_in, int* vals_out, int64_t n, int64_t rows,
                   const int64_t* off, int algo, cudaStream_t stream);

void sort_segments(torch::Tensor keys_in, torch::Tensor keys_out, torch::Tensor vals_in,
                   torch::Tensor vals_out, torch::Tensor offsets, int64_t algo) {
  TORCH_CHECK(keys_in.scalar_type() == torch::kInt32 && offsets.scalar_type() == torch::kInt64);
  const int64_t n = keys_in.numel(), rows = offsets.numel() - 1;
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  const int64_t* off = offsets.data_ptr<int64_t>();
  size_t bytes = s2o_cub_seg(nullptr, 0, nullptr, nullptr, nullptr, nullptr, n, rows, off,
                             (int)algo, stream);
  auto temp = torch::empty({(int64_t)bytes + 1}, keys_in.options().dtype(torch::kUInt8));
  s2o_cub_seg(temp.data_ptr(), bytes, keys_in.data_ptr(), keys_out.data_ptr(),
              vals_in.data_ptr<int>(), vals_out.data_ptr<int>(), n, rows, off, (int)algo, stream);
}

void sort_pairs(torch::Tensor keys_in, torch::Tensor keys_out, torch::Tensor vals_in,
                torch::Tensor vals_out, int64_t end_bit) {
  TORCH_CHECK(keys_in.is_cuda() && keys_in.is_contiguous() && keys_out.is_contiguous());
  TORCH_CHECK(keys_in.scalar_type() == torch::kInt64 && vals_in.scalar_type() == torch::kInt32);
  const int64_t n = keys_in.numel();
  size_t bytes = s2o_cub_temp_bytes(n, (int)end_bit);
  auto temp = torch::empty({(int64_t)bytes + 1}, keys_in.options().dtype(torch::kUInt8));
  s2o_cub_sort_pairs(temp.data_ptr(), bytes, keys_in.data_ptr(), keys_out.data_ptr(),
                     vals_in.data_ptr<int>(), vals_out.data_ptr<int>(), n, (int)end_bit,
                     c10::cuda::getCurrentCUDAStream().stream());
}
"""


@functools.cache
def _extension():
    from torch.utils.cpp_extension import load_inline

    try:
        return load_inline(
            name="s2o_cub_sort", cpp_sources=_CPP_SRC, cuda_sources=_CUDA_SRC,
            functions=["sort_pairs", "sort_segments"], extra_cuda_cflags=["-O3"], verbose=False,
        )  # fmt: skip
    except Exception as e:  # no nvcc / ninja, or a compiler error: say so, never fall back
        raise RuntimeError(
            "sort_mode='cub' compiles a CUB extension on first use and needs nvcc and ninja; "
            f"building it failed: {type(e).__name__}: {e}"
        ) from e


def sort_segments(keys, vals, offsets, algo: int) -> torch.Tensor:
    """Stable ascending sort of uint32 ``keys`` (int32 storage) inside rows ``[offsets[i],
    offsets[i+1])`` carrying int32 ``vals``; ``algo`` 0: segmented radix sort, 1: segmented sort."""
    keys_out = torch.empty_like(keys)
    vals_out = torch.empty_like(vals)
    _extension().sort_segments(keys, keys_out, vals, vals_out, offsets, algo)
    return vals_out


def sort_pairs(keys: torch.Tensor, vals: torch.Tensor, end_bit: int) -> torch.Tensor:
    """Stable ascending sort of int64 ``keys`` (as uint64, bits ``[0, end_bit)``) carrying int32
    ``vals``; returns the permuted ``vals``. CPU tensors use ``torch.sort`` (the same order) so
    the surrounding Triton kernels can be tested under the interpreter."""
    if not keys.is_cuda:
        return vals[torch.sort(keys, stable=True).indices]
    keys_out = torch.empty_like(keys)
    vals_out = torch.empty_like(vals)
    _extension().sort_pairs(keys, keys_out, vals, vals_out, end_bit)
    return vals_out
