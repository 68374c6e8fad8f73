"""The seconds each slow test took, for the order in which pytest-xdist hands out the tests
(tests/conftest.py: the longest first, so that the two workers of ``pytest -n 2`` end together
instead of one waiting for the other's last long test).

    pytest -n 2 -m "not gpu" --junitxml=/tmp/t.xml
    python tests/durations.py /tmp/t.xml     # rewrite tests/data/durations.json

Only the order matters (a test missing from the file, a new one, goes after the listed ones, in
collection order); the file holds the tests of 2 s or more (set-up, call and teardown).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FILE = Path(__file__).resolve().parent / "data" / "durations.json"
MIN_S = 2.0


def read(path: Path = FILE) -> dict[str, float]:
    """``{node id: seconds}``; empty without the file."""
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv: list[str]) -> None:
    (xml,) = argv
    seconds: dict[str, float] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        nodeid = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
        seconds[nodeid] = seconds.get(nodeid, 0.0) + float(case.get("time"))
    slow = {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= MIN_S}
    FILE.write_text(json.dumps(slow, indent=0) + "\n")
    print(f"{FILE}: {len(slow)} of {len(seconds)} tests, {sum(slow.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
