"""Shared test setup.

Without a GPU the Triton kernels run under the interpreter; Triton reads TRITON_INTERPRET when a
kernel is decorated, so it is set here, before any test module imports ``s2o.kernels``.

MKL's code path is pinned (``MKL_CBWR=COMPATIBLE``, read when torch loads MKL, so before the
import): on a CPU with AVX-512 MKL otherwise rounds float64 products differently, and the pinned
digests of tests/test_synthetic_pin.py hold on one kind of CPU only.

Under pytest-xdist each worker computes on one thread (the pinned digests hold either way).
"""

import ast
import functools
import os
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

# Under pytest-xdist the workers share the machine's cores: one intra-op thread each (and in the
# subprocesses tests start), so that two workers on two cores do not oversubscribe them. Set
# before torch loads numpy, whose OpenBLAS (the Triton interpreter's tl.dot) reads it then.
_XDIST = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
if _XDIST:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if _XDIST:
    torch.set_num_threads(1)

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


# Under pytest-xdist (`pytest -n 2`, the README's command) each worker builds its own module-scoped
# fixtures. The tests that use one (a smoke run, a copy of results/, a model) go to one worker with
# the others of their module that use one, so it is built once; the slurm tests too (one 2-CPU node,
# one sweep at a time); every other test is sent on its own. (xdist's `--dist loadgroup` would do
# this from marks, but under pytest 9.2 it no longer sees them: it renames `item._nodeid`, which
# pytest no longer reads.)
@functools.cache
def _sharing(file: Path) -> frozenset[str]:
    """The test functions of ``file`` that use a module-scoped fixture of it, directly or through
    another of its fixtures (read from the source: xdist's scheduler sees node ids only)."""
    funcs = [f for f in ast.parse(file.read_text()).body if isinstance(f, ast.FunctionDef)]
    args = {f.name: {a.arg for a in f.args.args} for f in funcs}
    shared = {f.name for f in funcs if any(_module_scoped(d) for d in f.decorator_list)}
    fixtures = {f.name for f in funcs if any("fixture" in ast.unparse(d) for d in f.decorator_list)}
    grown = True
    while grown:  # a fixture that uses a shared one is shared
        more = {name for name in fixtures - shared if args[name] & shared}
        shared |= more
        grown = bool(more)
    return frozenset(name for name in args if name.startswith("test") and args[name] & shared)


def _module_scoped(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Call) and any(
        k.arg == "scope" and getattr(k.value, "value", None) in ("module", "session")
        for k in decorator.keywords
    )


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unused without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":  # the default of -n; another --dist is obeyed
        return None
    from durations import read
    from xdist.scheduler import LoadScopeScheduling

    seconds = read()

    class SharedFixturesOnOneWorker(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path, _, rest = nodeid.partition("::")
            if path.endswith("test_slurm.py"):
                return path
            test = rest.split("::")[0].split("[")[0]
            return path if test in _sharing(config.rootpath / path) else nodeid

        def _assign_work_unit(self, node) -> None:
            # The longest units first (tests/durations.py), so that no long test starts last
            # while the other worker idles; unlisted tests after them, in collection order.
            if not self.ordered:
                self.ordered = True
                units = sorted(self.workqueue.items(),
                               key=lambda u: -sum(seconds.get(n, 0.0) for n in u[1]))  # fmt: skip
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SharedFixturesOnOneWorker(config, log)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
