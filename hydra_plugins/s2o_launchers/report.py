"""The end of a sweep, for every launcher: name the points that failed and make Hydra exit 1."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import CompactHydraException


class SweepFailed(CompactHydraException):
    """Raised by a launcher once every job has ended; Hydra prints the message and exits 1."""


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
    job_overrides: Sequence[Sequence[str]], rets: Sequence[JobReturn], initial_job_idx: int
) -> Sequence[JobReturn]:
    """Return ``rets`` if every job succeeded; else raise ``SweepFailed`` naming the failed ones."""
    shared = set.intersection(*(set(o) for o in job_overrides)) if len(job_overrides) > 1 else set()
    failed = []
    for i, (overrides, ret) in enumerate(zip(job_overrides, rets)):
        why = failure(ret)
        if why is not None:  # the point named by what sets it apart from the others
            point = " ".join(o for o in filter_overrides(overrides) if o not in shared)
            failed.append(f"  #{initial_job_idx + i} {point}: {why}")
    if not failed:
        return rets
    raise SweepFailed("\n".join([f"sweep: {len(failed)} of {len(rets)} points failed", *failed]))


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 3] + "..."
