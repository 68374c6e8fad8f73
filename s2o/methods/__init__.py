"""Attention methods behind one interface, registered by name (see ``registry.py``)."""

from . import flashprefill, flexprefill, full, pbs, s2o, xattn  # noqa: F401  (importing registers the methods)
from .registry import METHODS, BoundMethod, Method, bind, register, resolve_knobs, sparse_attention

__all__ = [
    "METHODS",
    "BoundMethod",
    "Method",
    "bind",
    "register",
    "resolve_knobs",
    "sparse_attention",
]
