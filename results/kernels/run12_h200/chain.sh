#!/bin/bash
# runs in the background on the device (setsid): probes, GPU tests, then Qwen e2e once the GGUF is in /tmp/q
. /tmp/env.sh; cd /tmp/tree
step() { echo "$(date +%T) $*"; }
step probe32; timeout 200 python3 -m benchmarks.kernel_probe --length 131072 --heads 32/8 --taus 0,0.005,0.01,0.02 --rep-ms 500 --rev $REV --out /tmp/rec > /tmp/out/probe32.log 2>&1; step "probe32 rc=$?"
step probe12; timeout 120 python3 -m benchmarks.kernel_probe --length 131072 --heads 12/2 --taus 0,0.005,0.01,0.02 --rep-ms 500 --rev $REV --out /tmp/rec > /tmp/out/probe12.log 2>&1; step "probe12 rc=$?"
step tests; timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py > /tmp/out/gpu_tests.txt 2>&1; step "tests rc=$?"
while [ ! -f /tmp/q/ready ]; do sleep 2; done
m=cache/models/qwen25-coder-1.5b; mkdir -p $m; g=$m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
cat /tmp/q/piece* > $g; sha256sum $g | cut -c1-64
M="[{name:s2o,tau:0.002},{name:s2o,tau:0.01},{name:s2o,tau:0.02},{name:s2o,tau:0.005,launch:{pass2:{walk:triton}}},{name:s2o,tau:0.01,launch:{pass2:{walk:triton}}},{name:s2o,tau:0.005,step1_sort:cub},{name:s2o,tau:0.01,step1_sort:cub},{name:s2o,tau:0.02,step1_sort:cub},{name:flashprefill,alpha:0.04},{name:flashprefill,alpha:0.08},{name:flashprefill,alpha:0.15},{name:flashprefill,alpha:0.25}]"
for spec in "131072 true 420" "32768 false 240" "65536 true 300"; do
  set -- $spec
  step "e2e $1"; timeout $3 python3 run.py kind=e2e model=qwen25_coder_1p5b model.yarn=$2 "e2e.lengths=[$1]" e2e.stock=false "e2e.methods=$M" method=s2o git_rev=$REV results_dir=/tmp/res progress=false > /tmp/out/e2e_$1.log 2>&1; step "e2e $1 rc=$?"
done
step ncu; timeout 300 /usr/local/cuda/bin/ncu --csv --page details --section SpeedOfLight -k regex:_s2o_ python3 -m benchmarks.kernel_probe --once --length 131072 --heads 32/8 --taus 0,0.005,0.01,0.02 --parts pass1,pass2,pass2_gluon,fused --rev $REV --out /tmp/rec_ncu > /tmp/out/ncu.csv 2> /tmp/out/ncu.err; step "ncu rc=$?"
step ALL_DONE
