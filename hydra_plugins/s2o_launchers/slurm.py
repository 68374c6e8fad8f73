"""SLURM through hydra-submitit-launcher (``hydra/launcher=slurm``), one array task per point, with
the failure summary: a point whose task raised, recorded an error, or was killed (``scancel``,
out of memory, time limit) is named, and the sweep exits 1 once every task has ended.

submitit's plugin stops at the first task that did not complete (its ``launch`` ends with
``[j.results()[0] for j in jobs]``, which raises), so the other tasks' outcomes are never seen;
``launch`` below is the plugin's, with that last line collecting each task on its own. Jobs are
the plugin's own callable: ``setup`` lines, ``checkpoint`` (requeue on preemption) and the rest
are unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from .report import finish, preflight

log = logging.getLogger(__name__)


class SlurmLauncher(Launcher):
    """submitit's ``SlurmLauncher`` (built from the same keys) with the failure summary."""

    def __init__(self, **params: Any) -> None:
        try:
            from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
                SlurmLauncher as Submitit,
            )
        except ImportError as exc:
            raise ImportError('hydra/launcher=slurm needs pip install -e ".[slurm]"') from exc
        self.submitit = Submitit(**params)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.submitit.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        inner = self.submitit
        preflight(
            inner.hydra_context, inner.config, inner.task_function, job_overrides, initial_job_idx
        )
        jobs = self._submit(job_overrides, initial_job_idx)
        rets = [_result(job, o) for job, o in zip(jobs, job_overrides)]
        return finish(job_overrides, rets, initial_job_idx, inner.task_function)

    def _submit(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """hydra-submitit-launcher 1.2's ``launch`` up to the submission of the array."""
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        inner = self.submitit
        assert inner.config is not None and len(job_overrides) > 0
        params = inner.params
        init_keys = {"max_num_timeout", "submitit_folder"}
        executor = submitit.AutoExecutor(
            cluster="slurm",
            folder=params["submitit_folder"],
            slurm_max_num_timeout=params["max_num_timeout"],
        )
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in base else f"slurm_{k}": v for k, v in params.items() if k not in init_keys}
        )
        sweep_dir = Path(str(inner.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in inner.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(inner.config.hydra.sweep.mode), 8))
        log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
        job_params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append(
                (
                    list(overrides),
                    "hydra.sweep.dir",
                    idx,
                    f"job_id_for_{idx}",
                    Singleton.get_state(),
                )
            )
        return executor.map_array(inner, *zip(*job_params))


def _result(job: Any, overrides: Sequence[str]) -> JobReturn:
    """The task's JobReturn; a task that did not complete becomes a FAILED one saying why."""
    try:
        return job.results()[0]
    except Exception as exc:  # noqa: BLE001  (UncompletedJobError, FailedJobError, ...: reported)
        state = getattr(job, "state", "?")
        err = RuntimeError(f"SLURM job {job.job_id} ended {state}: {_last_line(exc)}")
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=err)


def _last_line(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"
