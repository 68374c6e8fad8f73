"""The tables of one benchmark record (:mod:`analysis.bench_records`), as markdown.

    python -m analysis.bench_tables results/benchmarks/bench_s2o/<id>/record.json [...]

Prints, per record, what its benchmark measured: ``bench_s2o``: per L and tau the totals against
flash, and Step 1 by S; ``abcd``: the variants per (L, case); ``retrieval_latency``: Step 1 per
(L, S, sort mode) and flash per L; ``bench_baselines``: the methods at their defaults and the
shared kernel at random densities; ``fig5_bsa``: its rows (``analysis/fig5_bsa.py`` draws them).
Each table is one DataFrame through :func:`analysis.tables.markdown`; nothing is recomputed
beyond ratios of recorded times.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from analysis import bench_records as br
from analysis.tables import markdown


def _lengths(rec: dict) -> list[dict]:
    """``bench_s2o``'s per-length entries with ``flash_ms`` / ``cudnn_ms``."""
    return [{**x, "flash_ms": x["full_ms"].get("flash", x["full_ms"].get("math")),
             "cudnn_ms": x["full_ms"].get("cudnn")} for x in rec["metrics"]["lengths"]]  # fmt: skip


def s2o_frame(rec: dict) -> pd.DataFrame:
    """Per (L, tau): flash, cuDNN, Step 1 at the kernel's S, no-skip kernel, density, sparse
    kernel, total, and the speedups of the total."""
    seg = str(rec["config"]["segment_len"])
    rows = []
    for x in _lengths(rec):
        st1, s = x["step1_ms"][seg], x["s2o"]
        for sp in s["sparse"]:
            total = st1 + sp["kernel_ms"]
            rows.append({"L": x["L"], "flash": x["flash_ms"], "cuDNN": x["cudnn_ms"],
                         f"Step1 S={seg}": st1, "kernel tau<=0": s["noskip_ms"], "tau": sp["tau"],
                         "density": sp["density"], "kernel": sp["kernel_ms"],
                         "kernel/(d x no-skip)": sp["kernel_ms"] / (sp["density"] * s["noskip_ms"]),
                         "total": total, "vs flash": x["flash_ms"] / total,
                         "vs cuDNN": x["cudnn_ms"] / total if x["cudnn_ms"] else None})  # fmt: skip
    return pd.DataFrame(rows)


def step1_by_s(rec: dict) -> pd.DataFrame:
    rows = [{"L": x["L"], **{f"S={k}": v for k, v in x["step1_ms"].items()}} for x in _lengths(rec)]
    return pd.DataFrame(rows)


def baselines_frames(rec: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(methods, kernel)`` of a ``bench_baselines`` record."""
    m = rec["metrics"]
    methods = pd.DataFrame([r for r in m["methods"] if "error" not in r])
    methods["total_ms"] = methods["time_estimate_ms"] + methods["time_attention_ms"]
    return methods, pd.DataFrame(m["kernel"])


def _md(df: pd.DataFrame, formats: dict | None = None) -> str:
    """``markdown`` with two decimals for every float column not in ``formats``."""
    floats = {c: ".2f" for c in df.columns if pd.api.types.is_float_dtype(df[c])}
    return markdown(df, {**floats, **(formats or {})})


def tables(rec: dict) -> str:
    """Every table of ``rec`` as markdown, with a line naming the machine."""
    name, mach = br.benchmark(rec), br.machine(rec)
    date = mach["date"] or "date not recorded"
    parts = [f"{name} on {mach['gpu']}, git {mach['git']}, {date}; input: {br.input_name(rec)}. "
             "ms unless named.", ""]  # fmt: skip
    if name == "bench_s2o":
        parts += [_md(s2o_frame(rec), {"density": ".3f", "tau": "g"}), "",
                  "Step 1 by segment length S:", "", _md(step1_by_s(rec))]  # fmt: skip
        if any("abcd" in x for x in _lengths(rec)):
            parts += ["", "ABCD:", "", _md(br.abcd_frame(rec))]
    elif name == "abcd":
        parts.append(_md(br.abcd_frame(rec)))
    elif name in ("retrieval_latency", "step1_probe"):
        parts.append(_md(br.step1_frame(rec)))
        if len(br.flash_frame(rec)):
            parts += ["", _md(br.flash_frame(rec))]
    elif name == "fig5_bsa":
        parts.append(_md(pd.DataFrame(rec["metrics"]["rows"]), {"density": ".4f"}))
    elif name == "bench_baselines":
        methods, kernel = baselines_frames(rec)
        parts += [_md(methods, {"density": ".4f", "mse": ".3e"}), "", _md(kernel)]
    else:
        raise br.SchemaError(f"no tables for a record of benchmark {name!r}")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    for path in ap.parse_args(argv).records:
        try:
            text = tables(json.loads(path.read_text()))
        except br.SchemaError as e:
            raise br.SchemaError(f"{path}: {e}") from None
        print(f"## {path}\n\n{text}")


if __name__ == "__main__":
    main()
