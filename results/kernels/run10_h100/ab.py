# ruff: noqa  (the lab script as it ran on the GPU, kept beside its records; not project code)
"""Same-machine A/B of the walking kernels: `python ab.py gen FILE`, then `python ab.py time TREE FILE OUT`
per code tree (a process each, on the same saved Q/K/V), then `python ab.py compare OUT_A OUT_B`."""

import json
import sys

import torch


def gen(path):
    sys.path.insert(0, "local/gpu/new")
    from benchmarks import common

    shape = common.Shape(1, 32, 8, 128, "bfloat16", "cuda")
    q, k, v = common.make_qkv("synthetic", shape, 131072, 0)
    torch.save({"q": q, "k": k, "v": v}, path)


def time_tree(tree, path, out):
    sys.path.insert(0, tree)
    from triton.testing import do_bench

    from s2o.kernels import s2o_fused, s2o_pass1, s2o_pass2, s2o_step1

    d = torch.load(path)
    q, k, v = d["q"], d["k"], d["v"]
    geo = dict(segment_len=2048, local_window=0, block_m=128, block_n=128)
    qp, kvp = s2o_step1(q, k, segment_len=2048, index_dtype=torch.int32)
    st = s2o_pass1(q, k, v, **geo)
    rows, outs = [], {}
    for name, kw in (
        ("tau0_plain", dict(tau=0.0, early_stop=False)),
        ("tau0_stop", dict(tau=0.0, early_stop=True)),
        ("tau0.005", dict(tau=0.005)),
        ("tau0.02", dict(tau=0.02)),
    ):
        o, vis = s2o_pass2(q, k, v, st, qp, kvp, **kw, **geo)
        ms = do_bench(
            lambda: s2o_pass2(q, k, v, st, qp, kvp, **kw, **geo),
            warmup=50,
            rep=600,
            return_mode="median",
        )
        rows.append({"kernel": "pass2", "case": name, "ms": ms, "walked": int(vis.sum())})
        outs["pass2_" + name] = (o.float().cpu(), vis.cpu())
    for tau in (0.0, 0.005):
        o, vis = s2o_fused(q, k, v, kvp, tau=tau, **geo)
        ms = do_bench(
            lambda: s2o_fused(q, k, v, kvp, tau=tau, **geo),
            warmup=50,
            rep=600,
            return_mode="median",
        )
        rows.append({"kernel": "fused", "case": f"tau{tau:g}", "ms": ms, "walked": int(vis.sum())})
        outs[f"fused_tau{tau:g}"] = (o.float().cpu(), vis.cpu())
    torch.save(outs, out + ".pt")
    json.dump({"tree": tree, "gpu": torch.cuda.get_device_name(), "rows": rows}, open(out, "w"))
    print(json.dumps(rows))


def compare(a, b, dest):
    A, B = json.load(open(a)), json.load(open(b))
    oa, ob = torch.load(a + ".pt"), torch.load(b + ".pt")
    res = []
    for ra, rb in zip(A["rows"], B["rows"]):
        key = f"{ra['kernel']}_{ra['case']}"
        (xa, va), (xb, vb) = oa[key], ob[key]
        res.append(
            {
                "kernel": ra["kernel"],
                "case": ra["case"],
                "old_ms": ra["ms"],
                "new_ms": rb["ms"],
                "new_over_old": rb["ms"] / ra["ms"],
                "same_visits": bool(torch.equal(va, vb)),
                "max_abs_diff": float((xa - xb).abs().max()),
                "walked": ra["walked"],
            }
        )
    out = {"gpu": A["gpu"], "old": A["tree"], "new": B["tree"], "rows": res}
    json.dump(out, open(dest, "w"), indent=1)
    for r in res:
        print(r)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "gen":
        gen(sys.argv[2])
    elif cmd == "time":
        time_tree(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
