# started on GPU 1 at 17:59 by one call, after chain1 ended: chain1's e2e sweep again at 6059204's code
. /tmp/common.sh; cd /tmp/tree_old; export S2O_GIT_REV=6059204; mkdir -p cache/models; ln -sfn /tmp/models/qwen25-coder-1.5b cache/models/qwen25-coder-1.5b; ln -sfn /tmp/tree/cache/models/dequantized cache/models/dequantized
M="[{name:s2o,tau:0.002},{name:s2o,tau:0.01},{name:s2o,tau:0.02},{name:s2o,tau:0.005,step1_sort:cub},{name:s2o,tau:0.01,step1_sort:cub},{name:s2o,tau:0.02,step1_sort:cub},{name:s2o,tau:0.005,step1_sort:cub,step1_score_bits:16},{name:s2o,tau:0.01,step1_sort:cub,step1_score_bits:16},{name:s2o,tau:0.02,step1_sort:cub,step1_score_bits:16},{name:flashprefill,alpha:0.04},{name:flashprefill,alpha:0.08},{name:flashprefill,alpha:0.15},{name:flashprefill,alpha:0.25}]"
for spec in "131072 true 400" "32768 false 200" "65536 true 250"; do
  set -- $spec
  step "e2e $1"; timeout $3 python3 run.py kind=e2e model=qwen25_coder_1p5b model.yarn=$2 "e2e.lengths=[$1]" e2e.stock=false "e2e.methods=$M" method=s2o git_rev=6059204 results_dir=/tmp/res_old progress=false > /tmp/out/e2e_old_$1.log 2>&1; step "e2e $1 rc=$?"
done
step ALL_DONE
