"""Hydra's basic launcher (one job after another in this process) with the failure summary."""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn

from .report import finish, preflight


class LocalLauncher(BasicLauncher):
    """``hydra/launcher=local``: the default; checks every point first (``preflight``), exits 1
    naming the failed points, if any."""

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        preflight(
            self.hydra_context, self.config, self.task_function, job_overrides, initial_job_idx
        )
        rets = super().launch(job_overrides, initial_job_idx)
        return finish(job_overrides, rets, initial_job_idx, self.task_function)
