#!/bin/bash
# GPU 3: natural_niah (issue 52 part 1's validation): dense, S2O's default and FlexPrefill at 16K and 32K, three jobs at once
. /tmp/common.sh; cd /tmp/tree; model
for m in full s2o flexprefill; do
  step "nn_$m"; timeout 1500 python3 run.py kind=accuracy benchmark=natural_niah model=qwen25_coder_1p5b method=$m git_rev=$REV results_dir=/tmp/res progress=false > /tmp/out/nn_$m.log 2>&1 &
  sleep 20
done
wait; step "nn done"
step ALL_DONE
