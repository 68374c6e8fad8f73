"""The calibration check: the methods on real captured attention and on the calibrated input."""

from __future__ import annotations

from analysis.sections import Section


def section(ctx) -> Section:
    sec = Section(
        "calibration",
        "Calibrated synthetic input: does it rank the methods as real attention does?",
        "(no paper counterpart: the input behind our 128K studies)",
    )
    sec.missing_line(
        "the calibration check record (records.calibration_check)",
        "`python -m eval.calibrate --check` (CPU)",
    )
    return sec
