"""S2O's kernel against its reference on a real model's own inputs (issue 35: is a lost answer the
kernel's doing?).

For the retrieval diagnosis's samples that one record answered and an S2O record lost (by default
dense attention's and S2O's default at 32K), the model's post-RoPE Q/K/V of every chosen layer are
captured (``eval/capture.py``) on the sample's prompt, exactly as the accuracy job tokenized it;
then S2O runs on them twice with the S2O record's knobs: the Triton kernel in the model's dtype and
the PyTorch reference in fp32 on the same values. Per sample and layer the record holds the
relative error of the kernel's output against the reference's (all rows and the question's last
128 rows), the share of (batch x head, query tile) pairs whose Pass-2 walked the same number of key
tiles, and the density of each. GPU only (the kernel); at 32K the reference takes seconds a layer.

    R=results/accuracy/ruler/qwen25_coder_1p5b
    python -m benchmarks.kernel_on_samples --s2o $R/s2o/658195d78263/record.json \\
        --against $R/full/04f169c3cca7/record.json \\
        --model-path /tmp/q --gguf-file qwen.gguf --length 32768 --n 3 --out results/benchmarks
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

QUESTION_ROWS = 128  # the question and answer prefix sit in the prompt's last tile


def lost_ids(s2o_rec: Path, against_rec: Path, length: int) -> list[str]:
    """Sample ids at ``length`` where the ``against`` record scored above the S2O record."""
    from experiments.records import sample_lines

    def scores(p):
        return {x["id"]: float(x["score"]) for x in map(json.loads, sample_lines(p))
                if int(x["length"]) == length}  # fmt: skip

    a, s = scores(against_rec), scores(s2o_rec)
    return [i for i in a if i in s and a[i] > s[i]]


def parse_layers(text: str) -> list[int]:
    """``--layers 0,5,27`` -> ``[0, 5, 27]``; anything else is an error naming the value."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"--layers {text!r}: give 'all' or comma-separated integers") from None


def compare_layer(q, k, v, knobs: dict) -> dict:
    """The kernel (q's dtype) against the reference (fp32) on one layer's Q/K/V (CUDA tensors, or
    CPU ones under ``TRITON_INTERPRET=1``)."""
    import s2o

    t0 = time.perf_counter()
    out, st = s2o.s2o_attention(q, k, v, impl="triton", return_stats=True, **knobs)
    if q.is_cuda:
        torch.cuda.synchronize()
    kernel_s = time.perf_counter() - t0
    ref, rst = s2o.s2o_attention(q.float(), k.float(), v.float(), impl="reference",
                                 return_stats=True, **knobs)  # fmt: skip

    def rel(a, b):
        return float((a.float() - b).norm() / b.norm())

    walked, want = st.extra["pass2_tiles"].cpu(), rst.extra["pass2_tiles"].cpu()
    return {
        "rel_err": rel(out, ref),
        "rel_err_question_rows": rel(out[..., -QUESTION_ROWS:, :], ref[..., -QUESTION_ROWS:, :]),
        "same_walk_share": float((walked == want).double().mean()),
        "same_tiles_processed": bool(torch.equal(st.tiles_processed.cpu(),
                                                 rst.tiles_processed.cpu())),  # fmt: skip
        "density_kernel": 1.0 - float(st.sparsity),
        "density_reference": 1.0 - float(rst.sparsity),
        "kernel_s": kernel_s,
    }


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--s2o", type=Path, required=True, help="the S2O accuracy record.json")
    p.add_argument("--against", type=Path, required=True, help="the record that answered")
    p.add_argument("--model-path", required=True)
    p.add_argument("--gguf-file", required=True)
    p.add_argument("--length", type=int, default=32768)
    p.add_argument("--n", type=int, default=3, help="lost samples to check (the first n)")
    p.add_argument("--layers", default="all", help="'all' or comma-separated layer indices")
    p.add_argument("--rev", default=None, help="the code revision (default: git)")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.kernel_on_samples needs a CUDA GPU (the kernel)")

    from benchmarks.common import command_line, record_head
    from eval import capture
    from experiments import accuracy
    from experiments.records import benchmark_record_path, write_record

    rec = json.loads(args.s2o.read_text())
    cfg = rec["config"]
    knobs = {k: v for k, v in cfg["method"].items()
             if k not in ("impl", "launch", "step1_sort")}  # fmt: skip
    ids = lost_ids(args.s2o, args.against, args.length)[: args.n]
    if not ids:
        raise SystemExit(
            f"no sample at {args.length} that {args.against} answered and {args.s2o} lost"
        )
    device = torch.device("cuda")
    model_cfg = {**cfg["model"], "path": args.model_path, "gguf_file": args.gguf_file}
    model, tok = capture.load_model(model_cfg, device)
    n_layers = model.config.num_hidden_layers
    layers = list(range(n_layers)) if args.layers == "all" else parse_layers(args.layers)
    fmt = accuracy.prompt_format(tok, model_cfg)
    tasks = sorted({i.split("/")[1] for i in ids})
    bench = {**cfg["benchmark"], "tasks": tasks, "lengths": [args.length]}
    samples = {s["id"]: s for s in accuracy.build_samples(bench, fmt)}
    rows = []
    for sid in ids:
        s = samples[sid]
        input_ids = tok(s["prompt"], add_special_tokens=fmt.add_special_tokens,
                        return_tensors="pt")["input_ids"].to(device)  # fmt: skip
        qkv = capture.capture_qkv(model, input_ids, layers)
        for layer in layers:
            q, k, v = qkv[layer]
            row = {"id": sid, "layer": layer, "tokens": int(input_ids.shape[1]),
                   **compare_layer(q, k, v, knobs)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del qkv
        torch.cuda.empty_cache()
    config = {"s2o_record": str(args.s2o), "against_record": str(args.against),
              "length": args.length, "ids": ids, "layers": layers, "knobs": knobs}  # fmt: skip
    command = command_line("benchmarks.kernel_on_samples", argv)
    head = record_head("kernel_on_samples", config, command, device, args.rev)
    path = benchmark_record_path(args.out, "kernel_on_samples", head["id"])
    summary = {
        "max_rel_err": max(r["rel_err"] for r in rows),
        "max_rel_err_question_rows": max(r["rel_err_question_rows"] for r in rows),
        "min_same_walk_share": min(r["same_walk_share"] for r in rows),
        "layers_with_identical_tiles": sum(r["same_tiles_processed"] for r in rows),
        "layer_checks": len(rows),
    }
    write_record(path, {"status": "ok", **head, "metrics": {"summary": summary, "rows": rows}})
    print(json.dumps(summary), flush=True)
    print(f"record: {path}")
    return path


if __name__ == "__main__":
    main()
