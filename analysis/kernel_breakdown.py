"""The kernel breakdown of ``make_all``: for each S2O kernel on one input (Step 1's CUDA kernels,
Pass-1, Pass-2 at each tau, the fused kernel) and dense SDPA beside them, its time, the
arithmetic it did per second against the GPU's dense bf16 peak, and what bounds it by Nsight
Compute.

Reads the ``kernel_probe`` records pinned at ``records.kernels.breakdown`` (one per head shape) and,
beside each, ``ncu.csv`` (``ncu --csv --page details`` of ``benchmarks.kernel_probe --once`` on the
same GPU kind). The verdict is a generated sentence from :data:`VERDICTS`, the rules Nsight
Compute's own Speed-of-Light analysis applies (a unit above 60% of its peak bounds the kernel;
neither above: latency).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

import pandas as pd

from analysis import bench_records as br
from analysis.bench_sections import pinned
from analysis.sections import Section
from analysis.tables import markdown

# dense bf16 tensor-core peak by GPU model (vendor datasheets, no sparsity), TFLOP/s
PEAK_TFLOPS = {"H100 80GB HBM3": 989.0, "H200": 989.0}
SOL_BOUND = 60.0  # Nsight Compute's Speed-of-Light threshold, % of peak
VERDICTS = (  # (test on the Speed-of-Light numbers, sentence); the first that holds is the verdict
    (lambda m: m["sm"] >= SOL_BOUND and m["sm"] >= m["mem"], "compute-bound"),
    (lambda m: m["mem"] >= SOL_BOUND, "memory-bound"),
    (
        lambda m: m["eligible"] is not None,
        "latency-bound: neither unit above {bound:.0f}% of its peak, "
        "{eligible:.2f} of {active:.2f} warps per scheduler eligible",
    ),
    (
        lambda m: m["occupancy"] is not None,
        "latency-bound: neither unit above {bound:.0f}% of its peak, "
        "{occupancy:.1f}% achieved occupancy",
    ),
    (
        lambda m: True,  # ncu ran the Speed-of-Light section alone
        "latency-bound: neither unit above {bound:.0f}% of its peak",
    ),
)
NCU_COLUMNS = {
    "sm": "Compute (SM) Throughput",
    "mem": "Memory Throughput",
    "dram": "DRAM Throughput",
    "regs": "Registers Per Thread",
    "occupancy": "Achieved Occupancy",
    "active": "Active Warps Per Scheduler",
    "eligible": "Eligible Warps Per Scheduler",
    "l2_hit": "L2 Hit Rate",
}


def read_ncu(path: Path) -> dict[tuple[str, int], dict]:
    """``{(kernel name, n): Speed-of-Light numbers}`` of the ``n``-th launch of each kernel in an
    ``ncu --csv --page details`` file (ncu's own lines before the table are skipped). Memory
    Throughput is taken in %, the unit ncu gives it in under its Speed-of-Light section."""
    text = path.read_text()
    start = text.find('"ID"')
    if start < 0:
        raise ValueError(f'{path}: no ncu CSV table (no "ID" header)')
    by_id: dict[str, dict] = defaultdict(dict)
    names: dict[str, str] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        names[row["ID"]] = row["Kernel Name"]
        metric, unit, value = row["Metric Name"], row["Metric Unit"], row["Metric Value"]
        if metric == "Memory Throughput" and unit != "%":
            continue
        by_id[row["ID"]][metric] = _number(value)
    out, seen = {}, defaultdict(int)
    for i, metrics in sorted(by_id.items(), key=lambda kv: int(kv[0])):
        name = _short(names[i])
        out[(name, seen[name])] = {k: metrics.get(col) for k, col in NCU_COLUMNS.items()}
        seen[name] += 1
    return out


def _number(text: str) -> float | str | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:  # ncu's words ("no data", a cache mode): kept as they are
        return text or None


def verdict(m: dict) -> str:
    for test, sentence in VERDICTS:
        if test(m):
            return sentence.format(bound=SOL_BOUND, **m)
    raise AssertionError("the last verdict always holds")


def _short(name: str) -> str:
    """A CUDA kernel's name without template arguments and parameters."""
    base = name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].strip()
    return base.split("::")[-1].removeprefix("void ").strip()


def breakdown_frame(rec: dict) -> pd.DataFrame:
    """One row per timed kernel: ``kernel, tau, ms, density, tflops`` (TFLOP/s of the tiles the
    kernel computed, two ``128 x 128 x D`` products per tile; dense SDPA on the causal half)."""
    cfg, sh = rec["config"], br.shape(rec)
    L, D, hq, blk = cfg["length"], sh["D"], sh["Hq"], cfg["block"]
    tile_flop = 4.0 * blk * blk * D
    rows = []
    for r in rec["metrics"]["rows"]:
        part, ms = r["part"], r.get("ms")
        if ms is None or r.get("error"):
            continue
        flop = None
        if part == "full":
            name, flop = f"SDPA {r['backend']} (dense)", 4.0 * L * L / 2 * D * hq
        elif part == "step1":
            bits = f", {r['score_bits']}-bit scores" if r.get("score_bits") else ""
            name = f"Step 1 ({r['sort']} sort{bits}), all kernels"
        elif part == "pass1":
            name = "Pass-1"
        elif part in ("pass2", "pass2_gluon", "fused"):
            if r.get("launch", "default") != "default":
                continue
            stop = "" if part == "fused" or r.get("stop_logic") else ", no stop rule"
            label = {"pass2": "Pass-2", "pass2_gluon": "Gluon walk (Pass-2)", "fused": "fused"}
            name = label[part] + f" tau={r['tau']:g}{stop}"
            flop = r["walked_tiles"] * tile_flop
        else:
            continue
        rows.append(
            {
                "kernel": name,
                "ms": ms,
                "density": r.get("density"),
                "tflops": flop / ms / 1e9 if flop else None,
            }
        )
    return pd.DataFrame(rows)


def ncu_launches(names) -> list[tuple[str, int] | None]:
    """The ncu launch of each breakdown row: ``benchmarks.kernel_probe --once`` launches Pass-1
    once for the state, then every Pass-2 (Triton, then Gluon walk) and fused row twice (its walk
    counts, its timing), in the record's order, so the ``i``-th row of a kernel is its launch
    ``2 i``."""
    count, out = defaultdict(int), []
    for n in names:
        kernel = next(
            (
                k
                for p, k in (
                    ("Pass-1", "_s2o_pass1_kernel"),
                    ("Pass-2", "_s2o_pass2_kernel"),
                    ("Gluon walk", "_s2o_pass2_gluon_kernel"),
                    ("fused", "_s2o_fused_kernel"),
                )
                if n.startswith(p)
            ),
            None,
        )
        if kernel is None:
            out.append(None)
            continue
        out.append((kernel, 0 if kernel == "_s2o_pass1_kernel" else 2 * count[kernel]))
        count[kernel] += 1
    return out


def ncu_frame(ncu: dict, names) -> pd.DataFrame:
    """The launches the breakdown rows map to, then every other kernel as the mean of its
    launches (Step 1's sorts run dozens of times)."""
    rows, used = [], set()
    for name, key in zip(names, ncu_launches(names)):
        if key in ncu:
            rows.append({"kernel": name, **ncu[key]})
            used.add(key[0])
    rest = pd.DataFrame([{"kernel": k, **v} for (k, _), v in ncu.items() if k not in used])
    if len(rest):
        num = rest.drop(columns="kernel").apply(pd.to_numeric, errors="coerce")
        agg = num.groupby(rest["kernel"], sort=False).mean()
        agg.insert(0, "launches", rest.groupby("kernel", sort=False).size())
        rows += [
            {"kernel": f"{k} (x{int(r.launches)})", **r.drop("launches").to_dict()}
            for k, r in agg.iterrows()
        ]
    return pd.DataFrame(rows)


def section(ctx) -> Section:
    sec = Section(
        "kernel_breakdown",
        "Where S2O's time goes, kernel by kernel (issue 47)",
        "Not in the paper (its Sec. 5 reports totals)",
    )
    found = pinned(ctx, "kernels.breakdown")
    if not found:
        sec.missing_line(
            "a kernel_probe record (records.kernels.breakdown) with ncu.csv beside it",
            "`python -m benchmarks.kernel_probe --rev <sha>` and, for the verdicts, ncu over "
            "`python -m benchmarks.kernel_probe --once` (GPU)",
        )
        return sec
    for rec, path in found:
        m, sh = br.machine(rec), br.shape(rec)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in m["gpu"]), None)
        folder = Path(ctx.results).parent / Path(path).parent
        ncu_files = sorted(folder.glob("ncu*.csv"))
        ncu = {k: v for f in ncu_files for k, v in read_ncu(f).items()}
        df = breakdown_frame(rec)
        if peak:
            df["% of peak"] = df["tflops"] / peak * 100
        df["bound (ncu)"] = [verdict(ncu[k]) if k in ncu else ""
                             for k in ncu_launches(df["kernel"])]  # fmt: skip
        sec.body += [
            f"**{sh['Hq']}/{sh['Hkv']} heads, D={sh['D']}, L={rec['config']['length']:,}** "
            f"({m['gpu']}, git {m['git']}; {br.input_name(rec)}):",
            "",
            markdown(df, {"ms": ".2f", "density": ".3f", "tflops": ".0f", "% of peak": ".0f"}),
            "",
        ]
        kernels = next(
            (r["kernels"] for r in rec["metrics"]["rows"] if r["part"] == "step1_kernels"), []
        )
        if kernels:
            top = pd.DataFrame(
                [
                    {
                        "Step 1 CUDA kernel": _short(k["kernel"]),
                        "ms": k["ms"],
                        "launches": k["launches"],
                    }
                    for k in kernels[:6]
                ]
            )
            sec.body += [markdown(top, {"ms": ".2f", "launches": ".0f"}), ""]
        if ncu:
            fmt = {c: ".1f" for c in NCU_COLUMNS}
            head = "Nsight Compute (Speed of Light, % of peak; warps per scheduler; one row per"
            head += " launch above, Step 1's kernels as the mean over their launches):"
            sec.body += [head, "", markdown(ncu_frame(ncu, df["kernel"]), fmt), ""]
            rel = Path(ctx.results).parent
            sec.sources += [f"`{f.relative_to(rel)}`" for f in ncu_files]
        sec.sources.append(f"`{path}` ({m['gpu']}, git {m['git']})")
    sec.body.append(
        "TFLOP/s count the tiles a kernel computed (two 128 x 128 x D products a tile; SDPA the "
        "causal half) over its do_bench median; % of peak against the datasheet's dense bf16 "
        "rate. Pass-2's density adds Pass-1's tiles to the walked ones."
    )
    return sec
