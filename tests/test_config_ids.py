"""The run id of every experiment file, of each job of its multirun and of its in-process sweep's
points, and of representative command lines, stays what ``tests/data/config_ids.json`` recorded
(``tests/config_ids.py``): a change to the config layout that moved a run to another id (another
folder: its committed record would no longer be found, or be recomputed) fails here."""

from __future__ import annotations

import json

from config_ids import RENAMED, ROOT, SNAPSHOT, snapshot

# The ids that the 9 copy files' command lines had in the snapshot before conf/scale/ replaced
# them (tests/data/config_ids.json at 28c75f4): (the run's, its dry run's).
IDS_BEFORE_SCALE = {
    "experiment=fig4a_gemma3_270m_8k": ("af55dfe0f488", "372c2424ffba"),
    "experiment=fig4a_gemma3_270m_32k": ("ebad3b66676b", "372c2424ffba"),
    "experiment=fig4a_smollm2_135m_8k": ("b6dba7565b7b", "372c2424ffba"),
    "experiment=hparams_S_gemma3_270m_8k": ("3eaf46960379", "19701df766fa"),
    "experiment=hparams_S_gemma3_270m_32k": ("9fd17daba876", "19701df766fa"),
    "experiment=hparams_tau_gemma3_270m_8k": ("0b1f5a93e502", "8b1050384043"),
    "experiment=hparams_tau_gemma3_270m_32k": ("1e99dc8faeb9", "8b1050384043"),
    "experiment=component_ablation_gemma3_270m_8k": ("2d0543fb8094", "c0a785b0e219"),
    "experiment=component_ablation_gemma3_270m_32k": ("45473b89f3d9", "c0a785b0e219"),
}


def test_run_ids_are_those_of_the_snapshot():
    old = json.loads(SNAPSHOT.read_text())
    new = snapshot()
    assert sorted(new) == sorted(old), set(new) ^ set(old)
    moved = {k: (old[k], new[k]) for k in old if old[k] != new[k]}
    assert not moved, "\n".join(f"{k}\n  was {a}\n  now {b}" for k, (a, b) in moved.items())
    assert sum("id" in v for v in new.values()) > 250


def test_scale_presets_give_the_ids_of_the_files_they_replaced():
    """`experiment=<study> scale=<preset>` replaced 9 experiment files (issue 30, step 6). Their
    snapshot entries moved to the new command lines unchanged: each new line's entry holds the
    old line's ids, and its record lands in the old file's folder (results/experiments/<old
    name>/); the test above recomputes the new lines against these entries."""
    snap = json.loads(SNAPSHOT.read_text())
    assert set(RENAMED) == set(IDS_BEFORE_SCALE)
    for before, after in RENAMED.items():
        name = before.removeprefix("experiment=")
        assert not (ROOT / "conf" / "experiment" / f"{name}.yaml").exists()
        for suffix, want in zip(("", " dry_run=true"), IDS_BEFORE_SCALE[before], strict=True):
            assert before + suffix not in snap
            entry = snap[after + suffix]
            assert entry["id"] == want, (after + suffix, entry["id"], want)
            assert entry["path"] == f"experiments/{name}/{want}/record.json", entry["path"]
