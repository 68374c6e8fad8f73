"""Benchmark data: generated (RULER, InfiniteBench-style passkey/number) or loaded (InfiniteBench,
LongBench v2), with their official prompts; scoring lives in ``eval.metrics``."""
