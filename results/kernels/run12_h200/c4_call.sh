#!/bin/bash
. local/gpu/env.sh; cd local/gpu/tree_ov; export S2O_GIT_REV=f8c422b
timeout 150 python3 -m benchmarks.kernel_probe --length 131072 --heads 32/8 --taus 0,0.005,0.01,0.02 --rep-ms 500 --rev f8c422b --out /tmp/rec_full > $OUT/probe32_ov_full.log 2>&1; echo "probe rc=$?"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu=$NCU"
timeout 320 $NCU --csv --page details --section SpeedOfLight python3 -m benchmarks.kernel_probe --once --length 131072 --heads 32/8 --taus 0,0.005,0.01,0.02 --rev f8c422b --out /tmp/rec_ncu > $OUT/ncu.csv 2> $OUT/ncu.err; echo "ncu rc=$?"
wc -l $OUT/ncu.csv; tail -3 $OUT/ncu.err
tar czf $OUT/probe_full.tgz -C /tmp/rec_full .
