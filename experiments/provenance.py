"""Which code and which machine a record came from. Beyond the standard library it needs only
torch (imported inside :func:`environment`), so the GPU benchmarks (run without the harness's
packages: no Hydra, no OmegaConf) write the same ``environment`` block as the harness."""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# set by hydra/launcher=node_gpus in its workers: how many of them share one GPU
JOBS_PER_GPU_ENV = "S2O_JOBS_PER_GPU"


def jobs_per_gpu() -> int | None:
    """How many launcher jobs share this process's GPU (:data:`JOBS_PER_GPU_ENV`), else None."""
    k = os.environ.get(JOBS_PER_GPU_ENV, "")
    return int(k) if k.isdigit() else None


def git_revision(explicit: str | None) -> str:
    """``explicit`` (``--rev`` / ``git_rev``), else $S2O_GIT_REV, else ``git rev-parse HEAD``,
    else ``"unknown"``. Pass it explicitly on a machine that got a copy of the tree: a copied
    ``.git`` can name an older commit."""
    if explicit:
        return explicit
    if os.environ.get("S2O_GIT_REV"):
        return os.environ["S2O_GIT_REV"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# What a run's numbers depend on besides its config: the code under these paths.
CODE_PATHS = ("s2o", "eval", "experiments", "run.py")


@functools.lru_cache(maxsize=8)
def code_revision(explicit: str | None) -> str:
    """The code a record comes from: :func:`git_revision`, plus ``+dirty.<hash>`` when files under
    :data:`CODE_PATHS` differ from that commit (the hash of ``git diff HEAD`` over them), so an
    uncommitted kernel change is a different revision too. Computed once per process."""
    rev = git_revision(explicit)
    if explicit or os.environ.get("S2O_GIT_REV") or rev == "unknown":
        return rev
    try:
        out = subprocess.run(
            ["git", "diff", "HEAD", "--", *CODE_PATHS],
            cwd=ROOT, capture_output=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return rev
    if out.returncode != 0 or not out.stdout:
        return rev
    return f"{rev}+dirty.{hashlib.sha256(out.stdout).hexdigest()[:12]}"


def is_tracked(path: Path) -> bool:
    """Whether git tracks ``path`` (False outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--error-unmatch", str(Path(path).resolve())],
            cwd=ROOT, capture_output=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


@functools.lru_cache(maxsize=1)
def gpu_driver() -> str | None:
    """The NVIDIA driver version (``nvidia-smi``), None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


# one empty file per process that ran a record on a GPU, named ``<GPU uuid>.<pid>``
GPU_JOBS_DIR = Path(tempfile.gettempdir()) / "s2o_gpu_jobs"


def gpu_jobs(key: str, folder: Path | None = None) -> int:
    """How many live processes of this harness have run a record on the GPU ``key`` (its uuid) on
    this host, this one included, which is registered first. Where ``nvidia-smi`` lists no process
    (a container), jobs started side by side by hand are still seen; dead processes' files go."""
    folder = folder or GPU_JOBS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}.{os.getpid()}").touch()
    live = 0
    for f in folder.glob(f"{key}.*"):
        try:
            os.kill(int(f.suffix[1:]), 0)
        except ProcessLookupError:
            f.unlink(missing_ok=True)
            continue
        except (ValueError, PermissionError):
            pass  # not a pid of ours to judge, or another user's live process
        live += 1
    return live


def gpu_jobs_on(device) -> int | None:
    """:func:`gpu_jobs` for a CUDA ``device`` (None off CUDA or where its uuid is unknown)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    try:
        return gpu_jobs(str(torch.cuda.get_device_properties(device).uuid))
    except (RuntimeError, AttributeError, OSError):
        return None


def gpu_processes(device) -> int | None:
    """How many compute processes use ``device``'s GPU now, this one included (``nvidia-smi``,
    matched by GPU UUID, so ``CUDA_VISIBLE_DEVICES`` remapping does not matter). More than 1: the
    GPU was shared when the record was written, and the record's times may be too. None where it
    cannot be told (no nvidia-smi, or a container whose nvidia-smi lists no process)."""
    import torch

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError, RuntimeError, AttributeError):
        return None
    if out.returncode != 0:
        return None
    mine = [ln for ln in out.stdout.splitlines() if ln.split(",")[0].strip().endswith(uuid)]
    return len(mine) or None


def environment(device, git_rev: str | None) -> dict:
    """The ``environment`` block of every record (harness runs and benchmarks): the device and
    its model, driver, torch / Triton / CUDA / transformers versions, code revision
    (:func:`code_revision`), host, time,
    and on a GPU how many processes shared it (:func:`gpu_processes`) and how many of this
    harness's processes used it (:func:`gpu_jobs`; the record updates it when its job ends)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {
        "device": str(device),
        "device_name": name,
        "driver": gpu_driver() if device.type == "cuda" else None,
        "gpu_processes": gpu_processes(device) if device.type == "cuda" else None,
        "jobs_per_gpu": jobs_per_gpu(),
        "gpu_jobs": gpu_jobs_on(device),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "transformers": _package_version("transformers"),
        "python": platform.python_version(),
        # with +dirty.<hash> when the code differs from that commit: a GPU machine's copy of the
        # tree can carry a stale .git, and its records must not pass for that commit
        "git_revision": code_revision(git_rev),
        "hostname": socket.gethostname(),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_threads": torch.get_num_threads(),
    }
