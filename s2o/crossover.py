"""Where a sparse method starts to pay: the crossover length's one home.

A *crossover record* (``benchmarks/crossover.py``, written through ``benchmarks.common.Recorder``
to ``results/benchmarks/crossover/<id>/record.json``) times one attention call per length on one
GPU, for one head shape and one method with its knobs: dense (transformers' SDPA route) against
the method (its estimation, then its sparse attention), both through the calls
``s2o.hf.sparse_prefill`` makes. Its ``metrics.crossover`` is :func:`crossover_length` of those
rows; ``None`` when the method is not faster at any measured length.

``s2o.hf.sparse_prefill(..., min_len="auto")`` asks :func:`lookup` once, on entering, with a
:class:`CrossoverKey` (this GPU's name, the model's head shape and dtype, the method and its
validated knobs). Only ok records made on a GPU (never a ``--smoke`` run: CPU times are not a
GPU's) whose key equals it stand; of several, the newest (``environment.time``) does, and the
stats name the record. None: ``LookupError`` naming the key and the command that measures it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = "crossover"
RECORDS = ROOT / "results" / "benchmarks" / BENCHMARK
DEFAULT_MARGIN = 0.05


def crossover_length(rows: Sequence[Mapping], margin: float) -> int | None:
    """The smallest measured ``L`` from which on (that length and every longer one measured) the
    method is faster than dense by ``margin``: ``sparse_ms * (1 + margin) <= dense_ms``.
    ``None`` if it is not so at the longest length. ``rows``: ``{"L", "dense_ms", "sparse_ms"}``.
    """
    if not rows:
        raise ValueError("no rows: a crossover needs at least one measured length")
    if not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    found = None
    for row in sorted(rows, key=lambda r: r["L"], reverse=True):
        if row["sparse_ms"] * (1 + margin) > row["dense_ms"]:
            break
        found = int(row["L"])
    return found


def comparable_knobs(knobs: Mapping) -> dict:
    """Knobs as JSON gives them back (tuples as lists), so a record's and a model's compare."""
    return json.loads(json.dumps(dict(knobs), sort_keys=True, default=str))


def key_knobs(method: str, knobs: Mapping) -> dict:
    """:func:`comparable_knobs` less the method's optional knobs (``Method.optional_knobs``)
    where they are at their default: a record made before such a knob existed does not hold it,
    and still stands for a run that leaves it off."""
    from .methods import METHODS

    m = METHODS.get(method)
    out = comparable_knobs(knobs)
    for name in m.optional_knobs if m is not None else ():
        if name in out and out[name] == comparable_knobs({name: m.defaults[name]})[name]:
            del out[name]
    return out


@dataclass(frozen=True)
class CrossoverKey:
    """What a crossover depends on: the GPU model, the head shape and dtype, the method and its
    validated knobs (every knob, defaults included, except the layer-choosing ones; compared
    without the optional ones at their default, :func:`key_knobs`)."""

    device_name: str
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    method: str
    knobs: Mapping

    def describe(self) -> str:
        return (
            f"device {self.device_name!r}, {self.heads_q}/{self.heads_kv} heads, "
            f"head_dim {self.head_dim}, {self.dtype}, method {self.method!r} with knobs "
            f"{json.dumps(comparable_knobs(self.knobs), sort_keys=True)}"
        )

    def command(self, defaults: Mapping) -> str:
        """The command that measures this key on this GPU (knobs: those that differ from
        ``defaults``, the method's)."""
        given = {k: v for k, v in comparable_knobs(self.knobs).items()
                 if comparable_knobs({k: defaults.get(k)})[k] != v}  # fmt: skip
        parts = ["python", "-m", "benchmarks.crossover", "--method", self.method,
                 "--heads", f"{self.heads_q}/{self.heads_kv}", "--head-dim", str(self.head_dim),
                 "--dtype", self.dtype]  # fmt: skip
        if given:
            parts += ["--knobs", shlex.quote(json.dumps(given, sort_keys=True))]
        return " ".join(parts) + " --rev $(git rev-parse HEAD)"


@dataclass(frozen=True)
class Crossover:
    """A crossover record that stands for a key: ``min_len`` (``None``: the method was not faster
    at any length up to ``longest``), the record's path and the code revision it measured."""

    min_len: int | None
    longest: int
    path: str
    revision: str

    @property
    def source(self) -> str:
        return f"{self.path} (revision {self.revision})"


def record_key(rec: Mapping) -> CrossoverKey | None:
    """The key of an ok crossover record made on a GPU; ``None`` for any other record."""
    cfg = rec.get("config") or {}
    shape = cfg.get("shape") or {}
    if (rec.get("status") != "ok" or rec.get("benchmark") != BENCHMARK or cfg.get("smoke")
            or shape.get("device") != "cuda"):  # fmt: skip
        return None
    return CrossoverKey(
        rec["environment"]["device_name"], shape["Hq"], shape["Hkv"], shape["D"],
        shape["dtype"], cfg["method"], key_knobs(cfg["method"], cfg["knobs"]),
    )  # fmt: skip


def _records(root: Path) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(Path(root).glob("*/record.json")):
        rec = json.loads(path.read_text())
        if record_key(rec) is not None:
            out.append((path, rec))
    return out


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def lookup(key: CrossoverKey, defaults: Mapping, root: Path | None = None) -> Crossover:
    """The crossover of ``key`` from the records under ``root`` (default :data:`RECORDS`; the
    newest matching ok GPU record); ``LookupError`` naming the key, what was found instead and
    the measuring command (``defaults``: the method's, to print only the knobs that differ)."""
    root = RECORDS if root is None else Path(root)
    want = replace(key, knobs=key_knobs(key.method, key.knobs))
    found = _records(root)
    hits = [(p, r) for p, r in found if record_key(r) == want]
    if not hits:
        others = "; ".join(sorted({record_key(r).describe() for _, r in found})[:6]) or "none"
        raise LookupError(
            f"min_len='auto': no crossover record under {_rel(Path(root))} for "
            f"{key.describe()}. Records there are for: {others}. Measure it on this GPU with "
            f"`{key.command(defaults)}` and commit the record it writes, or pass an int min_len"
        )
    path, rec = max(hits, key=lambda pr: pr[1]["environment"]["time"])
    m = rec["metrics"]
    return Crossover(
        m["crossover"], max(r["L"] for r in m["rows"]), _rel(path),
        rec["environment"]["git_revision"],
    )  # fmt: skip
