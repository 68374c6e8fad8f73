#!/bin/bash
# GPU 2: RULER needle accuracy of the 16-bit Step-1 variant (the retrieval experiment's samples); natural_niah with FlashPrefill beside it
. /tmp/common.sh; cd /tmp/tree; model
step nn_fp; timeout 1500 python3 run.py kind=accuracy benchmark=natural_niah model=qwen25_coder_1p5b method=flashprefill git_rev=$REV results_dir=/tmp/res progress=false > /tmp/out/nn_flashprefill.log 2>&1 &
step bits16; timeout 1500 python3 run.py experiment=accuracy_retrieval_qwen_niah method=s2o method.step1_sort=cub +method.step1_score_bits=16 git_rev=$REV results_dir=/tmp/res progress=false > /tmp/out/bits16.log 2>&1; step "bits16 rc=$?"
wait; step "nn_fp done"
step ALL_DONE
