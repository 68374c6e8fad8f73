"""One module per experiment kind, each with ``run(cfg, ctx) -> dict`` (see run.py)."""
