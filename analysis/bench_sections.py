"""The artifacts of ``make_all`` that come from the kernel benchmark records: the ABCD tables
(causal, non-causal) with the per-component overhead table, and the retrieval (Step 1) latency
table. Every table is one DataFrame of records (:mod:`analysis.bench_records`, which reads the
harness's benchmark schema and refuses any other) through :func:`analysis.tables.markdown`.

``records.kernels.abcd`` in ``results/manifest.yaml`` is a path or a list of paths (an ``abcd`` or
``bench_s2o`` record each; a later record's row replaces an earlier one's at the same (L, case));
``records.kernels.step1`` a ``retrieval_latency`` record (or a migrated Step-1 probe,
``step1_probe``, then the flash column comes from ``records.kernels.default``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import bench_records as br
from analysis.sections import Section
from analysis.tables import markdown

CASES = {True: ("causal", "Causal"), False: ("noncausal", "Non-causal")}
KERNELS = (("A", "A: dense"), ("B", "B: indexed seq"), ("C", "C: indexed sorted"),
           ("D", "D: early stop (off)"))  # fmt: skip
TRANSITIONS = (("A", "B"), ("B", "C"), ("C", "D"), ("A", "D"))


def pinned(ctx, key: str) -> list[tuple[dict, str]]:
    """``[(record, path relative to the repo)]`` pinned at ``records.<key>`` (a path or a list of
    paths; missing files are left out)."""
    node = ctx.manifest.get("records") or {}
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    rels = node if isinstance(node, list) else [node] if node else []
    out = []
    for rel in rels:
        path = Path(ctx.results) / rel
        if path.is_file():
            rec = json.loads(path.read_text())
            try:
                br.benchmark(rec)
            except br.SchemaError as e:
                raise br.SchemaError(f"results/{rel} (records.{key}): {e}") from None
            out.append((rec, f"results/{rel}"))
    return out


def _source(rec: dict, path: str) -> str:
    m, sh = br.machine(rec), br.shape(rec)
    cut = "; PARTIAL: the run stopped before its last length" if br.partial(rec) else ""
    return (f"`{path}` ({m['gpu']}, git {m['git']}, shape {sh['Hq']}/{sh['Hkv']} heads, "
            f"D={sh['D']}{cut})")  # fmt: skip


def _kernel_table(ours: pd.DataFrame, paper: dict) -> pd.DataFrame:
    """Rows A-D; per length ours and the paper's ms."""
    rows = []
    for kernel, label in KERNELS:
        row = {"kernel": label}
        for L in ours["L"]:
            row[f"ours {br.length_label(L)}"] = float(ours.loc[ours["L"] == L, kernel].iloc[0])
            row[f"paper {br.length_label(L)}"] = paper.get(kernel, {}).get(int(L))
        rows.append(row)
    return pd.DataFrame(rows)


def _overhead_table(cases: dict[bool, pd.DataFrame], marginal: dict) -> pd.DataFrame:
    """Per transition: our overhead per case and length, and the paper's per case."""
    rows = []
    for a, b in TRANSITIONS:
        row = {"transition": f"{a} -> {b}"}
        for causal, df in cases.items():
            suffix = "" if causal else " non-causal"
            for r in df.itertuples(index=False):
                row[f"{br.length_label(r.L)}{suffix}"] = (
                    f"{(getattr(r, b) / getattr(r, a) - 1) * 100:+.1f}%"
                )
        row["paper (causal)"] = marginal[f"{a}{b}"]["causal"]
        row["paper (non-causal)"] = marginal[f"{a}{b}"]["noncausal"]
        rows.append(row)
    return pd.DataFrame(rows)


def _abcd_rows(found: list[tuple[dict, str]]) -> pd.DataFrame:
    frames = [br.abcd_frame(rec) for rec, _ in found]
    df = pd.concat(frames, ignore_index=True)
    return df.drop_duplicates(["L", "causal"], keep="last").sort_values(["causal", "L"])


def abcd(ctx) -> Section:
    sec = Section(
        "abcd",
        "ABCD decomposition (causal, non-causal) and per-component overhead",
        "Appendix tables: ABCD decomposition (causal / non-causal), per-component "
        "marginal overhead (A100, S=1024)",
    )
    found = pinned(ctx, "kernels.abcd")
    if not found:
        sec.missing_line(
            "an abcd record (records.kernels.abcd)", "`python -m benchmarks.abcd --rev <sha>` (GPU)"
        )
        return sec
    rows, paper = _abcd_rows(found), ctx.paper["abcd"]
    cases = {c: rows[rows["causal"] == c].reset_index(drop=True) for c in (True, False)}
    cases = {c: df for c, df in cases.items() if len(df)}
    for causal, df in cases.items():
        table = _kernel_table(df, paper[CASES[causal][0]])
        sec.body += [f"{CASES[causal][1]}, kernel-only ms (ours and the paper's A100 numbers):",
                     "", markdown(table, {c: ".2f" for c in table.columns if c != "kernel"}),
                     ""]  # fmt: skip
    ab = [(r.B / r.A - 1) * 100 for df in cases.values() for r in df.itertuples(index=False)]
    gpus = ", ".join(sorted({br.machine(rec)["gpu"] for rec, _ in found}))
    inputs = "; ".join(sorted({br.input_name(rec) for rec, _ in found}))
    sec.body += [
        "Per-component overhead (relative to the previous variant):",
        "",
        markdown(_overhead_table(cases, paper["marginal"])),
        "",
        f"**Differs:** {gpus}, not A100; Triton kernels (A is our own two-pass kernel reading "
        "contiguous tiles, not FlashAttention-2's CUDA kernel, and B-D add our gathers and stop "
        f"loop to it), so the gather costs more (A->B {min(ab):+.0f} to {max(ab):+.0f}% here, "
        f"5-8% in the paper); input: {inputs} (the decomposition runs with no skipping, so the "
        "input barely matters).",
    ]
    if False not in cases:
        sec.missing_line(
            "the non-causal ABCD decomposition (an abcd record with non-causal rows)",
            "`python -m benchmarks.abcd --rev <sha>` (GPU; times both cases)",
        )
    sec.sources += [_source(rec, path) for rec, path in found]
    return sec


def retrieval(ctx) -> Section:
    sec = Section(
        "retrieval",
        "Retrieval (Step 1) overhead vs (L, S), FlashAttention beside it",
        "Appendix table: retrieval latency vs (L, S)",
    )
    found = pinned(ctx, "kernels.step1")
    if not found:
        sec.missing_line(
            "a retrieval_latency record (records.kernels.step1)",
            "`python -m benchmarks.retrieval_latency --rev <sha>` (GPU)",
        )
        return sec
    (probe, ppath), paper = found[-1], ctx.paper["retrieval"]
    by = br.step1_frame(probe)
    flash_src = [(probe, ppath)] if len(br.flash_frame(probe)) else pinned(ctx, "kernels.default")
    flash = {int(r.L): r.flash_ms for r in br.flash_frame(flash_src[0][0] if flash_src else None)
             .itertuples(index=False)}  # fmt: skip
    rows = []
    for L in sorted(set(by["L"]) | set(paper["rows"])):
        row = {"L": br.length_label(L)}
        for S in (512, 1024, 2048, 4096):
            for mode in ("chunks", "cub"):
                hit = by[(by["L"] == L) & (by["S"] == S) & (by["sort_mode"] == mode)]
                row[f"{mode} S={S}"] = float(hit["ms"].iloc[0]) if len(hit) else None
            row[f"paper S={S}"] = paper["rows"].get(L, [None] * 5)[paper["S"].index(S)]
        row["flash (ours)"] = flash.get(L)
        row["flash (paper)"] = paper["rows"].get(L, [None] * 5)[4]
        rows.append(row)
    df = pd.DataFrame(rows)
    m = br.machine(probe)
    sec.body += [
        markdown(df, {c: ".2f" for c in df.columns if c != "L"}),
        "",
        "`chunks`: the default Step 1 (`torch.sort`); `cub`: the opt-in CUB radix sort. "
        "ms, do_bench median.",
        f"**Differs:** {m['gpu']}, not A100; "
        + ("our table starts at 8K (no 4K record); " if 4096 not in set(by["L"]) else "")
        + "below about 1 ms Step 1 is bound by the host (Python and launches), so short-L entries "
        "move by +-0.3 ms between runs. Our flash column is SDPA flash at 32 query / 8 KV heads, "
        "D=128, bf16, causal; the paper does not state the shape of its flash column (320 ms at "
        "128K, where its ABCD table's dense kernel at H=32 takes 717 ms).",
    ]
    cut = "; PARTIAL: the run stopped before its last length" if br.partial(probe) else ""
    sec.sources.append(f"`{ppath}` ({m['gpu']}, git {m['git']}{cut})")
    if flash_src and flash_src[0][1] != ppath:
        sec.sources.append(f"`{flash_src[0][1]}` (flash column)")
    return sec
