"""``hydra/sweeper=points``: one multirun made of several sweeps, so that one command runs every
row of a table whose rows are not one cartesian product.

Hydra's basic sweeper runs the product of the command line's value lists. An accuracy table's
rows are a union instead: every method at its defaults, then each method's own knob swept
(``tau`` x ``S`` for S2O, ``gamma`` for FlexPrefill, ...). With this sweeper,
``hydra.sweeper.points`` lists those sweeps, each a string of overrides in command-line syntax
(a value list is swept there, as on the command line):

    hydra:
      sweeper:
        points:
          - method=full,s2o,flexprefill,xattn,pbs
          - method=s2o tau=0.002,0.02 S=512,2048
          - method=flexprefill method.gamma=0.7,0.95

Each point's jobs are the product of the command line's overrides and the point's own, the
point's winning for a key both set. The jobs of all points run in order, in one multirun (one
launcher, one model load per process with the local launcher), and a job that two points both
make runs once. With no points it is Hydra's basic sweeper.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override


class PointsSweeper(BasicSweeper):
    """Hydra's basic sweeper over a union of sweeps (``points``); see the module docstring."""

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        points: Sequence[str] | None = None,
    ) -> None:
        # BasicSweeper.__init__ calls super(BasicSweeper, self), which fails once Hydra's plugin
        # scan has re-imported its module (another class object of the same name): its state
        # is set here instead
        self.overrides = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context = None
        self.config = None
        self.launcher = None
        points = list(points or [])
        bad = [p for p in points if not isinstance(p, str) or not p.strip()]
        if bad:
            raise ValueError(
                f"hydra.sweeper.points: {bad[0]!r} is not a string of overrides "
                "(e.g. 'method=s2o tau=0.002,0.02')"
            )
        self.points = points

    def split_arguments(  # type: ignore[override]  # BasicSweeper.sweep calls it on self
        self, overrides: list[Override], max_batch_size: int | None
    ) -> list[list[list[str]]]:
        if not self.points:
            return BasicSweeper.split_arguments(overrides, max_batch_size)
        jobs = expand(self.points, overrides, self._parser())
        if max_batch_size is None:
            return [jobs]
        return [jobs[i : i + max_batch_size] for i in range(0, len(jobs), max_batch_size)]

    def _parser(self) -> OverridesParser:
        loader = self.hydra_context.config_loader if self.hydra_context is not None else None
        return OverridesParser.create(config_loader=loader)


def expand(points: Sequence[str], base: list[Override], parser: OverridesParser) -> list[list[str]]:
    """Every job of ``points`` on top of the ``base`` overrides, in order, each once."""
    jobs, seen = [], set()
    for i, text in enumerate(points):
        try:
            own = parser.parse_overrides(shlex.split(text))
        except Exception as e:  # noqa: BLE001  (Hydra's parser raises several types)
            raise ValueError(f"hydra.sweeper.points[{i}]={text!r}: {e}") from e
        keys = {o.get_key_element() for o in own}
        merged = [o for o in base if o.get_key_element() not in keys] + own
        for job in BasicSweeper.split_arguments(merged, None)[0]:
            if tuple(job) not in seen:
                seen.add(tuple(job))
                jobs.append(job)
    return jobs
