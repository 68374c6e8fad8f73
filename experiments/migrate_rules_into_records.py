"""One-off migration (issue 30, "analysis reads records only"): write into the committed records
the rules that ``analysis/calibration_check.py`` used to import from the producers.

- calibration fit records (``results/captures/calibration_fit_*.json``): ``stats``
  (``eval.calibrate.STATS``) and ``bounds`` (``eval.calibrate.BOUNDS``), as
  ``experiments/calibration_fit.py`` now records them. Valid because both constants, read from
  ``eval/calibrate.py`` at each record's ``git_revision``, equal today's (checked here).
- kind=matched records: ``metrics.reach_sparsity`` (``experiments.matched.REACH_SPARSITY``, as
  ``experiments/matched.py`` now records it). A record made at or after 65b27bf (where the
  producer's ratios began to apply the rule) must hold the same value at its revision (checked
  here); an older record's ratios compared every bisection end, and the value is the one its
  readers have applied to its ``at_sparsity`` points (``analysis/calibration_check.py``'s ``TOL``
  since d409870), which the added ``migrations`` entry says.

Each changed record gets a ``migrations`` entry naming this script and what it added; its bytes
are otherwise the same (the file's own JSON layout is kept, and checked to round-trip first).
Run once from the repository root; a second run changes nothing:

    PYTHONPATH=. python -m experiments.migrate_rules_into_records
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

from eval.calibrate import BOUNDS, STATS

from .matched import REACH_SPARSITY

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "experiments/migrate_rules_into_records.py"
RULE_COMMIT = "65b27bf"  # matched: ratios compare only methods that reached the target
LAYOUTS = ({"indent": 2}, {"indent": 1, "sort_keys": True})  # write_record's; the old fit's


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _constants(rev: str, path: str, names: tuple[str, ...]) -> dict | None:
    """The literal module-level ``names`` of ``path`` at ``rev``; None if git lacks ``rev``."""
    out = _git("show", f"{rev}:{path}")
    if out.returncode != 0:
        return None
    found = {}
    for node in ast.parse(out.stdout).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in names:
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def _layout(text: str, rec: dict) -> dict:
    for layout in LAYOUTS:
        if json.dumps(rec, **layout) + "\n" == text:
            return layout
    raise SystemExit("a record whose JSON layout this script does not reproduce; not migrated")


def _write(path: Path, rec: dict, layout: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, **layout) + "\n")
    os.replace(tmp, path)


def _note(added: list[str], why: str) -> dict:
    return {"script": SCRIPT, "added": added, "why": why}


def migrate_fit(rec: dict) -> str:
    rev = rec["git_revision"]
    then = _constants(rev, "eval/calibrate.py", ("STATS", "BOUNDS"))
    if then != {"STATS": STATS, "BOUNDS": BOUNDS}:
        raise SystemExit(f"eval/calibrate.py at {rev}: STATS or BOUNDS differ from today's")
    rec["stats"], rec["bounds"] = list(STATS), {k: list(v) for k, v in BOUNDS.items()}
    return f"eval.calibrate.STATS and BOUNDS at this record's revision {rev} equal these"


def _has_rule(env: dict) -> bool:
    """Whether the record's code already applied the reach rule (its revision descends from
    ``RULE_COMMIT``; a revision git lacks, rebased away, is placed by the record's time)."""
    rev = env["git_revision"].split("+")[0]
    if _git("cat-file", "-e", f"{rev}^{{commit}}").returncode == 0:
        return _git("merge-base", "--is-ancestor", RULE_COMMIT, rev).returncode == 0
    rule_time = _git("log", "-1", "--format=%cI", RULE_COMMIT).stdout.strip()
    return datetime.fromisoformat(env["time"]) >= datetime.fromisoformat(rule_time)


def migrate_matched(rec: dict) -> str:
    rev = rec["environment"]["git_revision"].split("+")[0]
    metrics = rec["metrics"]
    if _has_rule(rec["environment"]):
        then = _constants(rev, "experiments/matched.py", ("REACH_SPARSITY",))
        if then != {"REACH_SPARSITY": REACH_SPARSITY}:
            raise SystemExit(f"experiments/matched.py at {rev}: REACH_SPARSITY {then}")
        why = (f"experiments.matched.REACH_SPARSITY at this record's revision {rev} (its ratios "
               "apply it)")  # fmt: skip
    else:
        why = (f"made before {RULE_COMMIT} (the producer's reach rule): its ratios compare every "
               "bisection end; this is the rule its readers apply to its at_sparsity points "
               "(analysis/calibration_check.py since d409870)")  # fmt: skip
    at = list(metrics).index("ratios") + 1
    items = list(metrics.items())
    rec["metrics"] = dict(items[:at] + [("reach_sparsity", REACH_SPARSITY)] + items[at:])
    return why


def targets() -> list[tuple[Path, str]]:
    """``(path, kind)`` of each tracked record this migration applies to."""
    out = []
    for name in _git("ls-files", "results").stdout.split():
        path = ROOT / name
        if path.suffix != ".json":
            continue
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if path.name.startswith("calibration_fit") and "per_head" in rec:
            out.append((path, "fit"))
        elif isinstance(rec, dict) and rec.get("kind") == "matched" and "metrics" in rec:
            out.append((path, "matched"))
    return out


def main() -> None:
    for path, kind in targets():
        text = path.read_text()
        rec = json.loads(text)
        layout = _layout(text, rec)
        if kind == "fit" and "stats" not in rec:
            why, added = migrate_fit(rec), ["stats", "bounds"]
        elif kind == "matched" and "reach_sparsity" not in rec["metrics"]:
            why, added = migrate_matched(rec), ["metrics.reach_sparsity"]
        else:
            continue
        rec.setdefault("migrations", []).append(_note(added, why))
        _write(path, rec, layout)
        print(f"{path.relative_to(ROOT)}: {', '.join(added)}")


if __name__ == "__main__":
    main()
