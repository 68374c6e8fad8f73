#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_min/*.whl > /dev/null 2>&1 || { echo pip failed; exit 1; }
. local/gpu/env.sh; cd local/gpu/tree; mkdir -p /tmp/rec
for spec in "12/2 125" "32/8 80"; do
  set -- $spec; h=$1
  timeout $2 python3 -m benchmarks.kernel_probe --length 131072 --heads $h --parts step1,pass1 --step1-sorts chunks,cub,cub16,cub24 --taus 0.005,0.01,0.02 --rep-ms 300 --rev $REV --out /tmp/rec > $OUT/s1_${h/\//_}.log 2>&1; echo "$h rc=$?"
  grep -E '"part": "(step1|step1_score_bits|pass2_score_bits)"' $OUT/s1_${h/\//_}.log | cut -c1-250
done
tar czf $OUT/s1.tgz -C /tmp/rec .
