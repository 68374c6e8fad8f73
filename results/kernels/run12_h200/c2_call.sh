#!/bin/bash
. local/gpu/env.sh; cd local/gpu/tree
timeout 280 python3 -m benchmarks.kernel_probe --length 131072 --heads 32/8 --gluon-stages 3 --taus 0,0.005,0.01,0.02 --rep-ms 500 --rev $REV --out /tmp/rec > $OUT/probe32.log 2>&1; echo "probe32 rc=$?"
grep -v '"kernel"' $OUT/probe32.log | grep -E '"part": "(full|step1|pass1|pass2|pass2_gluon|fused)"' | cut -c1-220
tar czf $OUT/probe.tgz -C /tmp/rec .
