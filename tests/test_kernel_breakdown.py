"""analysis/kernel_breakdown: the ncu CSV reader, the verdict rules and the launch mapping."""

from analysis.kernel_breakdown import ncu_launches, read_ncu, verdict

HEAD = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'


def _row(i, kernel, metric, unit, value):
    return f'"{i}","{kernel}","SOL","{metric}","{unit}","{value}"\n'


def test_read_ncu_numbers_launch_order_and_percent_memory(tmp_path):
    rows = [
        _row(0, "_s2o_pass2_kernel", "Compute (SM) Throughput", "%", "40.5"),
        _row(0, "_s2o_pass2_kernel", "Memory Throughput", "byte/s", "1,000,000"),
        _row(0, "_s2o_pass2_kernel", "Memory Throughput", "%", "30"),
        _row(1, "void cub::Sort<float>(int)", "DRAM Throughput", "%", "no data"),
        _row(2, "_s2o_pass2_kernel", "Compute (SM) Throughput", "%", "20"),
    ]
    f = tmp_path / "ncu.csv"
    f.write_text("==PROF== Connected\n" + HEAD + "".join(rows))
    got = read_ncu(f)
    assert got[("_s2o_pass2_kernel", 0)]["sm"] == 40.5
    assert got[("_s2o_pass2_kernel", 0)]["mem"] == 30.0  # the % row, not bytes/s
    assert got[("_s2o_pass2_kernel", 1)]["sm"] == 20.0
    assert got[("Sort", 0)]["dram"] == "no data"


def test_verdict_rules():
    base = dict(sm=10.0, mem=10.0, eligible=None, active=None, occupancy=12.5)
    assert verdict({**base, "sm": 70.0, "mem": 65.0}) == "compute-bound"
    assert verdict({**base, "mem": 61.0}) == "memory-bound"
    assert "0.50 of 2.00 warps" in verdict({**base, "eligible": 0.5, "active": 2.0})
    assert "12.5% achieved occupancy" in verdict(base)
    sol_only = {**base, "occupancy": None}  # ncu ran the Speed-of-Light section alone
    assert verdict(sol_only) == "latency-bound: neither unit above 60% of its peak"


def test_ncu_launches_maps_rows_to_the_probes_launch_order():
    names = ["SDPA flash (dense)", "Pass-1", "Pass-2 tau=0, no stop rule", "Pass-2 tau=0",
             "fused tau=0", "fused tau=0.02"]  # fmt: skip
    assert ncu_launches(names) == [
        None,
        ("_s2o_pass1_kernel", 0),
        ("_s2o_pass2_kernel", 0),
        ("_s2o_pass2_kernel", 2),
        ("_s2o_fused_kernel", 0),
        ("_s2o_fused_kernel", 2),
    ]


def test_gluon_walk_rows_are_named_apart_and_map_to_the_gluon_kernels_launches():
    from analysis.kernel_breakdown import breakdown_frame

    row = dict(launch="default", stop_logic=True, density=0.1, walked_tiles=1000.0)
    rec = {
        "kind": "benchmark",
        "benchmark": "kernel_probe",
        "config": {"length": 4096, "block": 128, "shape": {"B": 1, "Hq": 2, "Hkv": 1, "D": 128}},
        "metrics": {"rows": [{"part": "pass2", "tau": 0.005, "ms": 2.0, **row},
                             {"part": "pass2_gluon", "tau": 0.005, "ms": 1.0, **row},
                             {"part": "pass2", "tau": 0.02, "ms": 1.0, **row}]},
    }  # fmt: skip
    names = list(breakdown_frame(rec)["kernel"])
    assert names == ["Pass-2 tau=0.005", "Gluon walk (Pass-2) tau=0.005", "Pass-2 tau=0.02"]
    assert ncu_launches(names) == [
        ("_s2o_pass2_kernel", 0),
        ("_s2o_pass2_gluon_kernel", 0),
        ("_s2o_pass2_kernel", 2),
    ]
