"""Attention methods behind one interface, registered by name (see ``registry.py``)."""

from . import full, s2o  # noqa: F401  (importing registers the methods)
from .registry import METHODS, Method, register, resolve_knobs, sparse_attention

__all__ = ["METHODS", "Method", "register", "resolve_knobs", "sparse_attention"]
