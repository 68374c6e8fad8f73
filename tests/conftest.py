"""Shared test setup.

Without a GPU the Triton kernels run under the interpreter; Triton reads TRITON_INTERPRET when a
kernel is decorated, so it is set here, before any test module imports ``s2o.kernels``.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
