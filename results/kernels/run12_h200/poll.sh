#!/bin/bash
# $1: seconds to wait at most for ALL_DONE (0: just a snapshot)
[ -d /tmp/tree ] || { echo "LOST: fresh machine"; exit 3; }
end=$(( $(date +%s) + ${1:-0} ))
while [ $(date +%s) -lt $end ] && ! grep -q ALL_DONE /tmp/out/chain.log; do sleep 5; done
cat /tmp/out/chain.log; tail -n 4 /tmp/out/gpu_tests.txt 2>/dev/null
tar czf $OUT/snap.tgz -C /tmp out rec res 2>/dev/null; ls -la $OUT
