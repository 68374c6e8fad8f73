"""The README says only what a clone can check: no path outside the repository, every pytest
marker in its list, no timing claim that no record holds."""

from __future__ import annotations

import re
import sys

import pytest
from harness_util import ROOT

README = (ROOT / "README.md").read_text()


def test_the_readme_names_no_path_outside_the_repository():
    assert not re.findall(r"\.\./[\w./-]+", README)


def test_the_readme_lists_every_pytest_marker():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = {m.split(":")[0] for m in ini["markers"]}
    (line,) = [x for x in README.splitlines() if "markers:" in x]
    listed = {m.strip() for m in line.split("markers:")[1].split(",")}
    assert listed == markers, (listed, markers)


@pytest.mark.parametrize("claim", ["about 18 s", "in seconds", "6cdda63dbf14"])
def test_the_readme_makes_no_timing_claim_from_no_record(claim):
    assert claim not in README
