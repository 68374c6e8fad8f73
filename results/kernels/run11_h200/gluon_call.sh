#!/bin/bash
. local/gpu/env.sh; cd local/gpu/tree
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 230 python3 -m benchmarks.probes.gluon_walk --length 131072 --heads 32/8 --out $OUT/gluon_walk.json > $OUT/gluon.log 2>&1; echo "rc=$?"
tail -c 6000 $OUT/gluon.log
