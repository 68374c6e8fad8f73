"""Shared helpers of the harness tests: compose configs by hand and run jobs in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=overrides, return_hydra_config=True)


def run_inprocess(overrides: list[str], results: Path) -> dict:
    import run

    quiet = ["wandb.mode=disabled", f"results_dir={results}", "progress=false"]
    return run.run_job(compose(overrides + quiet))


def run_cli(args: list[str], results: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "run.py"), *args, "wandb.mode=disabled",
           f"results_dir={results}", "progress=false", f"hydra.run.dir={results}/hydra",
           f"hydra.sweep.dir={results}/hydra_multi"]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
