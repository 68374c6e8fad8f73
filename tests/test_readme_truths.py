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


def test_every_speedup_the_readme_states_is_in_a_record_it_cites():
    """A ratio such as ``1.58x`` (two decimals: a measurement, not a target like ``1.8x``) stands
    in a paragraph that names the file it comes from, and that file says it."""
    ratio = re.compile(r"\b\d+\.\d\dx\b")
    claims = [p for p in re.split(r"\n\s*\n", README) if ratio.search(p)]
    assert claims, "no speedup found: is the pattern right?"
    for paragraph in claims:
        cited = [ROOT / f for f in re.findall(r"`(results/[\w./-]+\.(?:md|json))`", paragraph)]
        said = " ".join(f.read_text() for f in cited if f.is_file())
        unsupported = [x for x in ratio.findall(paragraph) if x not in said]
        assert cited and not unsupported, (unsupported or ratio.findall(paragraph), cited)
