"""No import circle inside the project's packages: for every package, the modules its files import
(at the top or inside a function, absolute or relative) form a graph without a cycle. A lazy
import that runs back up (``experiments.records`` once asked ``experiments.accuracy`` for its
checks while ``accuracy`` imported ``records``) counts as a circle too."""

from __future__ import annotations

import ast

import pytest
from harness_util import ROOT

PACKAGES = ("s2o", "experiments", "eval", "analysis", "benchmarks")


def _module(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path, package: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the file at ``path`` imports (a name imported from a
    package counts as its submodule where one exists)."""
    me = _module(path)
    base = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                root = base[: len(base) - node.level + 1]
                mod = ".".join(root + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known and n != me}
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    files = [p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts]
    known = {_module(p) for p in files}
    graph = {_module(p): _imports(p, package, known) for p in files}
    # a package's __init__ imports its modules and they import names from it: that edge is a
    # package's own export list, not a circle; drop module -> its own package edges
    for mod, deps in graph.items():
        graph[mod] = {d for d in deps if not mod.startswith(d + ".")}
    done: set[str] = set()

    def visit(node, stack):
        assert node not in stack, f"import circle: {' -> '.join([*stack, node])}"
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, [*stack, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
