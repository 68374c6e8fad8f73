"""Triton kernels compiled for a GPU may read only ``tl.constexpr`` module globals (a plain
``EPS = 1e-9`` read inside an ``@triton.jit`` function is a compile error there), but the CPU
interpreter (``TRITON_INTERPRET=1``) accepts them. This static check stands in for the GPU
compiler on the CPU: every global name a kernel reads must be a module, a function, a JIT
function or a ``tl.constexpr``."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import types

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import s2o.kernels  # noqa: E402

JIT_TYPES = (
    "JITFunction",
    "InterpretedFunction",
    "Autotuner",
    "Heuristics",
    "JITCallable",
    "GluonJITFunction",
)


def _kernel_modules():
    for info in pkgutil.iter_modules(s2o.kernels.__path__):
        yield importlib.import_module(f"s2o.kernels.{info.name}")


def _is_jit(node: ast.FunctionDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
        if isinstance(target, ast.Name) and target.id == "jit":
            return True
    return False


def bad_globals(module, source: str | None = None) -> list[str]:
    """``module.kernel: NAME = value`` for each non-constexpr value global a kernel reads
    (``source``: the module's text where inspect cannot find it)."""
    tree = ast.parse(source or inspect.getsource(module))
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.FunctionDef) and _is_jit(node)):
            continue
        local = {a.arg for a in node.args.args + node.args.kwonlyargs}
        local |= {n.id for n in ast.walk(node)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}  # fmt: skip
        for n in ast.walk(node):
            if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) or n.id in local:
                continue
            if n.id not in vars(module):
                continue  # a builtin (range, min) or a name the compiler knows
            value = vars(module)[n.id]
            if isinstance(value, (types.ModuleType, types.FunctionType, type, tl.constexpr)):
                continue
            if type(value).__name__ in JIT_TYPES:
                continue
            out.append(f"{module.__name__}.{node.name}: {n.id} = {value!r}")
    return out


def test_kernels_read_only_constexpr_globals():
    bad = [b for m in _kernel_modules() for b in bad_globals(m)]
    assert not bad, f"a Triton kernel reads a non-constexpr global (no GPU compile): {bad}"


def test_the_check_finds_a_plain_float_global():
    mod = types.ModuleType("fake_kernels")
    src = (
        "import triton\nimport triton.language as tl\nEPS = 1e-9\nOK = tl.constexpr(2.0)\n"
        "@triton.jit\ndef k(X, N: tl.constexpr):\n    x = tl.load(X)\n"
        "    tl.store(X, x / (x + EPS) * OK)\n"
    )
    exec(compile(src, "<fake>", "exec"), mod.__dict__)
    assert bad_globals(mod, src) == ["fake_kernels.k: EPS = 1e-09"]
