"""The run id of every experiment file, of each job of its multirun and of its in-process sweep's
points, and of representative command lines, stays what ``tests/data/config_ids.json`` recorded
(``tests/config_ids.py``): a change to the config layout that moved a run to another id (another
folder: its committed record would no longer be found, or be recomputed) fails here."""

from __future__ import annotations

import json

from config_ids import SNAPSHOT, snapshot


def test_run_ids_are_those_of_the_snapshot():
    old = json.loads(SNAPSHOT.read_text())
    new = snapshot()
    assert sorted(new) == sorted(old), set(new) ^ set(old)
    moved = {k: (old[k], new[k]) for k in old if old[k] != new[k]}
    assert not moved, "\n".join(f"{k}\n  was {a}\n  now {b}" for k, (a, b) in moved.items())
    assert sum("id" in v for v in new.values()) > 250
