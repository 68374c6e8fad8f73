#!/bin/bash
# $1: seconds to wait at most for every chain's ALL_DONE (0: just a snapshot)
[ -d /tmp/tree ] || { echo "LOST: fresh machine"; exit 3; }
end=$(( $(date +%s) + ${1:-0} ))
done4() { [ $(cat /tmp/out/chain?.log 2>/dev/null | grep -c ALL_DONE) -ge 4 ]; }
while [ $(date +%s) -lt $end ] && ! done4; do sleep 5; done
tail -n 3 /tmp/out/chain?.log /tmp/out/assemble.log; tail -n 2 /tmp/out/gpu_tests.txt 2>/dev/null; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
tar czf $OUT/snap.tgz --exclude='*.samples*' --exclude='samples*' -C /tmp out rec rec_old rec_ncu res 2>/dev/null
tar czf $OUT/acc.tgz -C /tmp res 2>/dev/null; ls -la $OUT
