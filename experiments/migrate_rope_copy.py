"""One-off migration: take back what transformers wrote into a committed record's stored config.

Before the fix in ``eval/models.py`` (a deep copy of ``model.arch`` before building a random-weight
model), ``AutoConfig.for_model(**arch)`` wrote ``rope_theta`` into the run's own
``model.arch.rope_scaling`` dict (Llama-3.1's ``llama3`` scaling) after the run's id had been
hashed, so the stored config was no longer the one its ``config_id`` hashes
(``tests/test_record_ids.py`` found it in ``e2e/llama31_8b/s2o/2dd75b4d652f``, made at 28c75f4).
The value it wrote equals ``model.arch.rope_theta``, which transformers read anyway: the run used
the same architecture either way.

A record is changed only where removing that key makes its stored config hash to its
``config_id`` again (checked here); it gets a ``migrations`` entry naming this script. Run once
from the repository root; a second run changes nothing:

    PYTHONPATH=. python -m experiments.migrate_rope_copy
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from . import records

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "experiments/migrate_rope_copy.py"
KEY = "config.model.arch.rope_scaling.rope_theta"


def fixed(rec: dict) -> dict | None:
    """The record with the written key taken back, or None where it needs no change."""
    idn, cfg = rec.get("identity"), rec.get("config") or {}
    arch = ((cfg.get("model") or {}).get("arch")) or {}
    scaling = arch.get("rope_scaling")
    if not isinstance(idn, dict) or not isinstance(scaling, dict) or "rope_theta" not in scaling:
        return None
    device = None if idn["device_model"] == "cpu" else idn["device_model"]
    if records.config_id(cfg, records._drop_for(cfg), device) == idn["config_id"]:
        return None  # consistent as stored
    out = copy.deepcopy(rec)
    if out["config"]["model"]["arch"]["rope_scaling"].pop("rope_theta") != arch.get("rope_theta"):
        raise SystemExit("the written rope_theta differs from model.arch.rope_theta: not this bug")
    new = out["config"]
    if records.config_id(new, records._drop_for(new), device) != idn["config_id"]:
        raise SystemExit("removing rope_theta does not restore the config_id: not this bug")
    why = ("written by transformers into the run's config after its id was hashed (fixed in "
           "eval/models.py); equal to model.arch.rope_theta")  # fmt: skip
    out.setdefault("migrations", []).append({"script": SCRIPT, "removed": [KEY], "why": why})
    return out


def main() -> None:
    for path in sorted((ROOT / "results").rglob("record.json")):
        text = path.read_text()
        rec = json.loads(text)
        if json.dumps(rec, indent=2) + "\n" != text:
            continue  # another layout: not written by write_record, not a run record
        new = fixed(rec)
        if new is not None:
            records.write_record(path, new)
            print(f"migrated: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
