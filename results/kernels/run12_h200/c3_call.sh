#!/bin/bash
. local/gpu/env.sh; cd local/gpu/tree
timeout 150 python3 -m benchmarks.kernel_probe --length 131072 --heads 12/2 --gluon-stages 3 --taus 0,0.005,0.01,0.02 --rep-ms 500 --rev $REV --out /tmp/rec > $OUT/probe12.log 2>&1; echo "probe12 rc=$?"
grep -E '"part": "(full|step1|pass1|pass2|pass2_gluon|fused)"' $OUT/probe12.log | cut -c1-220
cd ../tree_ov
for h in 32/8 12/2; do S2O_GIT_REV=f8c422b timeout 150 python3 -m benchmarks.kernel_probe --length 131072 --heads $h --parts pass2_gluon --taus 0,0.005,0.01,0.02 --rep-ms 500 --rev f8c422b --out /tmp/rec_ov > $OUT/probe_ov_${h/\//_}.log 2>&1; echo "ov $h rc=$?"; grep pass2_gluon $OUT/probe_ov_${h/\//_}.log | cut -c1-220; done
tar czf $OUT/probe.tgz -C /tmp/rec .
tar czf $OUT/probe_ov.tgz -C /tmp/rec_ov .
