"""Benchmark scripts: ``python -m benchmarks.<name>`` (see benchmarks/common.py)."""
