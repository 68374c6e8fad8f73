"""The two ends of a sweep, for every launcher: before job #0, every point's config is checked
(:func:`preflight`: a bad value refuses the whole sweep, nothing runs); after the last job, one
table of the points (ok, skipped, failed, their metrics), then the points that failed are named
and Hydra exits 1 (:func:`finish`). The checks and the table are the task's module's (run.py's
``refusal`` and ``sweep_table``): this package imports only Hydra and OmegaConf."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig


class SweepFailed(CompactHydraException):
    """Raised by a launcher once every job has ended; Hydra prints the message and exits 1."""


def preflight(
    hydra_context: HydraContext | None,
    config: DictConfig | None,
    task_function: Callable | None,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> None:
    """Refuse the sweep before its first job when any point would be refused: one line per bad
    point, exit code 2, no job run. The check is the task's module's ``refusal(cfg)`` (run.py's:
    value types, missing keys, data files, the kind's checks); a task without one is not checked.
    A point that passes and fails while computing still records its error while the sweep goes
    on (:func:`finish`)."""
    refusal = _task_attr(task_function, "refusal")
    if hydra_context is None or config is None or refusal is None:
        return
    shared = _shared(job_overrides)
    bad = []
    for i, overrides in enumerate(job_overrides):
        try:
            cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
            HydraConfig.instance().set_config(copy.deepcopy(cfg))
            why = refusal(cfg)
        except Exception as exc:  # noqa: BLE001  (a composition error: Hydra raises several types)
            why = _first_line(str(exc))
        if why is not None:
            point = " ".join(o for o in filter_overrides(overrides) if o not in shared)
            bad.append(f"  #{initial_job_idx + i} {point}: {why}")
    if bad:
        print(
            "\n".join([f"error: sweep not started: {len(bad)} of {len(job_overrides)} points "
                       "refused (fix them and rerun; no point ran)", *bad]),
            file=sys.stderr,
        )  # fmt: skip
        raise SystemExit(2)


def _shared(job_overrides: Sequence[Sequence[str]]) -> set[str]:
    """The overrides every job has (a point is named by the others)."""
    if len(job_overrides) <= 1:
        return set()
    return set.intersection(*(set(o) for o in job_overrides))


def failure(ret: JobReturn) -> str | None:
    """Why the job of ``ret`` failed, or None when it succeeded.

    A job failed when it raised or its process died (the launcher marks it ``FAILED`` with the
    exception), or when it returned run.py's outcome with a status other than ``ok`` (the point
    recorded its error) or with failed points of an in-process sweep.
    """
    if ret.status == JobStatus.FAILED:
        exc = ret._return_value
        return _first_line(f"{type(exc).__name__}: {exc}")
    value = ret._return_value
    if not isinstance(value, dict):
        return None
    where = f" (record: {value['path']})" if value.get("path") else ""
    if value.get("status", "ok") != "ok":
        return _first_line(str(value.get("error") or value["status"])) + where
    if value.get("failed"):
        return f"points of the job failed: {', '.join(map(str, value['failed']))}{where}"
    return None


def finish(
    job_overrides: Sequence[Sequence[str]],
    rets: Sequence[JobReturn],
    initial_job_idx: int,
    task_function: Callable | None = None,
) -> Sequence[JobReturn]:
    """Print the sweep's table (the task's module's ``sweep_table``, run.py's: one row per point,
    its status and headline metrics), then return ``rets`` if every job succeeded; else raise
    ``SweepFailed`` naming the failed ones."""
    shared = _shared(job_overrides)
    failed, points = [], []
    for i, (overrides, ret) in enumerate(zip(job_overrides, rets)):
        point = " ".join(o for o in filter_overrides(overrides) if o not in shared)
        why = failure(ret)
        if why is not None:  # the point named by what sets it apart from the others
            failed.append(f"  #{initial_job_idx + i} {point}: {why}")
        points.append({"num": initial_job_idx + i, "point": point or "-", **_status(ret)})
    table = _task_attr(task_function, "sweep_table")
    if table is not None and len(rets) > 1:
        print(table(points), flush=True)
    if not failed:
        return rets
    raise SweepFailed("\n".join([f"sweep: {len(failed)} of {len(rets)} points failed", *failed]))


def _status(ret: JobReturn) -> dict:
    """``status`` (ok, skipped, error, failed) and ``path`` of a job's record, if any."""
    value = ret._return_value if ret.status != JobStatus.FAILED else None
    if not isinstance(value, dict):
        return {"status": "failed" if ret.status == JobStatus.FAILED else "ok", "path": None}
    status = value.get("status", "ok")
    if status == "ok" and value.get("skipped"):
        status = "skipped"
    elif status == "ok" and value.get("failed"):
        status = f"ok ({len(value['failed'])} failed)"
    return {"status": status, "path": value.get("path")}


def _task_attr(task_function: Callable | None, name: str) -> Callable | None:
    """``name`` in the module of the task function (run.py's ``refusal``, ``sweep_table``)."""
    return getattr(sys.modules.get(getattr(task_function, "__module__", "")), name, None)


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 3] + "..."
