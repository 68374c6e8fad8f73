"""Shared helpers of the harness tests: compose configs by hand and run jobs in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# Hydra's parse of each config file (``ConfigRepository.load_config``: the YAML read, its
# defaults list), by (config sources, file): ``compose`` parses each file once per test process
# and hands Hydra a deep copy of that parse each time (Hydra changes what it loads). A third of
# a compose's time otherwise; tests/test_config_ids.py composes 328 command lines. The test
# processes never change a file under conf/.
_PARSED: dict = {}


def compose(overrides: list[str]):
    """The config of ``python run.py <overrides>``, with its ``hydra`` node. As Hydra does before
    a job, ``HydraConfig`` is set to it (a copy: it makes its hydra node read-only), so that
    ``${hydra:runtime.choices.scale}`` (a scaled study's ``name``, conf/scale/study/) resolves."""
    import copy

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra._internal.config_repository import ConfigRepository
    from hydra.core.hydra_config import HydraConfig

    parse = ConfigRepository.load_config

    def parsed_once(repo, config_path):
        key = (tuple((s.provider, s.path) for s in repo.sources), config_path)
        if key not in _PARSED:
            _PARSED[key] = parse(repo, config_path)
        return copy.deepcopy(_PARSED[key])

    ConfigRepository.load_config = parsed_once
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
    finally:
        ConfigRepository.load_config = parse
    HydraConfig.instance().set_config(copy.deepcopy(cfg))
    return cfg


def scaled() -> list[tuple[str, str]]:
    """``(study, preset)`` of every ``python run.py experiment=<study> scale=<preset>``: each
    conf/scale/ preset with each study that conf/scale/study/ scales."""
    presets = sorted(p.stem for p in (CONF / "scale").glob("*.yaml"))
    studies = sorted(p.stem for p in (CONF / "scale" / "study").glob("*.yaml"))
    return [(study, preset) for study in studies for preset in presets]


def run_inprocess(overrides: list[str], results: Path) -> dict:
    import run

    quiet = ["wandb.mode=disabled", f"results_dir={results}", "progress=false"]
    return run.run_job(compose(overrides + quiet))


def run_cli(args: list[str], results: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "run.py"), *args, "wandb.mode=disabled",
           f"results_dir={results}", "progress=false", f"hydra.run.dir={results}/hydra",
           f"hydra.sweep.dir={results}/hydra_multi"]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def qwen_gguf() -> Path | None:
    """The real Qwen2.5-Coder-1.5B-Instruct GGUF (1.1 GB) where it is already on disk, else None:
    ``$S2O_QWEN_GGUF``, or where conf/model/qwen25_coder_1p5b.yaml assembles it
    (``<cache_dir>/qwen25-coder-1.5b/<gguf_file>``). Tests never fetch it (CI has no such file)."""
    import os

    from omegaconf import OmegaConf

    if os.environ.get("S2O_QWEN_GGUF"):
        path = Path(os.environ["S2O_QWEN_GGUF"])
        return path if path.is_file() else None
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "qwen25_coder_1p5b.yaml"),
                                 resolve=True)  # fmt: skip
    path = ROOT / cfg["cache_dir"] / "qwen25-coder-1.5b" / cfg["gguf_file"]
    return path if path.is_file() else None
