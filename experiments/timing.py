"""The one timer of the harness and the benchmarks: ``do_bench`` medians (CUDA events) on a GPU,
wall-clock medians on the CPU (smoke runs; CPU times are not the point)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def bench_ms(fn: Callable[[], object], device: torch.device, timing: dict) -> float:
    """Median milliseconds of ``fn``: ``do_bench`` on CUDA, wall-clock over ``rep`` calls on CPU.

    On the CPU the untimed warm-up calls number ``timing.warmup``; ``timing.rep < 1`` is refused.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        with torch.cuda.device(device):
            return float(
                do_bench(
                    fn,
                    warmup=timing["cuda_warmup_ms"],
                    rep=timing["cuda_rep_ms"],
                    return_mode="median",
                )  # fmt: skip
            )
    if timing["rep"] < 1 or timing["warmup"] < 0:
        raise ValueError(
            f"timing.rep={timing['rep']!r} must be >= 1 and timing.warmup={timing['warmup']!r} >= 0"
        )
    for _ in range(timing["warmup"]):
        fn()
    times = []
    for _ in range(timing["rep"]):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
