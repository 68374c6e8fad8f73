#!/bin/bash
. local/gpu/env.sh; cd local/gpu/tree
timeout 230 python3 -m benchmarks.kernel_probe --length 131072 --heads 32/8 --variants 4:3:32 --rep-ms 500 --rev $REV --out /tmp/rec > $OUT/probe32.log 2>&1; echo "probe32 rc=$?"
timeout 130 python3 -m benchmarks.kernel_probe --length 131072 --heads 12/2 --variants 4:3:32 --rep-ms 500 --rev $REV --out /tmp/rec > $OUT/probe12.log 2>&1; echo "probe12 rc=$?"
tail -5 $OUT/probe32.log $OUT/probe12.log
tar czf $OUT/probe.tgz -C /tmp/rec .
