#!/bin/bash
# $1 length, $2 yarn (true|false), $3 timeout
. local/gpu/env.sh
m=local/gpu/tree/cache/models/qwen25-coder-1.5b; mkdir -p $m
[ -f $m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ] || cat /tmp/q/piece* > $m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
ls -la $m; cd local/gpu/tree
M="[{name:s2o,tau:0.002},{name:s2o,tau:0.005},{name:s2o,tau:0.01},{name:s2o,tau:0.02},{name:s2o,tau:0.005,step1_sort:cub},{name:flashprefill,alpha:0.04},{name:flashprefill,alpha:0.08},{name:flashprefill,alpha:0.15},{name:flashprefill,alpha:0.25}]"
timeout $3 python3 run.py kind=e2e model=qwen25_coder_1p5b model.yarn=$2 "e2e.lengths=[$1]" e2e.stock=false "e2e.methods=$M" method=s2o git_rev=$REV results_dir=/tmp/res progress=false > $OUT/e2e_$1.log 2>&1; echo "e2e rc=$?"
tail -25 $OUT/e2e_$1.log
tar czf $OUT/e2e_$1.tgz -C /tmp/res .
