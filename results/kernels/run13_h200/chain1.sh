#!/bin/bash
# GPU 1: Qwen TTFT at matched density, S2O's exact CUB Step 1 and its 16-bit variant beside FlashPrefill's alphas
. /tmp/common.sh; cd /tmp/tree; model
M="[{name:s2o,tau:0.002},{name:s2o,tau:0.01},{name:s2o,tau:0.02},{name:s2o,tau:0.005,step1_sort:cub},{name:s2o,tau:0.01,step1_sort:cub},{name:s2o,tau:0.02,step1_sort:cub},{name:s2o,tau:0.005,step1_sort:cub,step1_score_bits:16},{name:s2o,tau:0.01,step1_sort:cub,step1_score_bits:16},{name:s2o,tau:0.02,step1_sort:cub,step1_score_bits:16},{name:flashprefill,alpha:0.04},{name:flashprefill,alpha:0.08},{name:flashprefill,alpha:0.15},{name:flashprefill,alpha:0.25}]"
for spec in "131072 true 480" "32768 false 240" "65536 true 330"; do
  set -- $spec
  step "e2e $1"; timeout $3 python3 run.py kind=e2e model=qwen25_coder_1p5b model.yarn=$2 "e2e.lengths=[$1]" e2e.stock=false "e2e.methods=$M" method=s2o git_rev=$REV results_dir=/tmp/res progress=false > /tmp/out/e2e_$1.log 2>&1; step "e2e $1 rc=$?"
done
step ALL_DONE
