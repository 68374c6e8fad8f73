#!/bin/bash
# GPU 0: the Gluon walk's reorder against 6059204's walk, GPU tests, ncu sections, crossover records
. /tmp/common.sh; cd /tmp/tree
P="python3 -m benchmarks.kernel_probe --length 131072 --rep-ms 500"
step probe32; timeout 240 $P --heads 32/8 --taus 0,0.005,0.01,0.02 --rev $REV --out /tmp/rec > /tmp/out/probe32.log 2>&1; step "probe32 rc=$?"
step old32; (cd /tmp/tree_old && timeout 150 $P --heads 32/8 --parts full,pass2_gluon --taus 0,0.005,0.01,0.02 --rev 6059204 --out /tmp/rec_old > /tmp/out/old32.log 2>&1); step "old32 rc=$?"
step tests; timeout 240 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py tests/test_gluon_walk.py > /tmp/out/gpu_tests.txt 2>&1; step "tests rc=$?"
step probe12; timeout 150 $P --heads 12/2 --taus 0,0.005,0.01,0.02 --rev $REV --out /tmp/rec > /tmp/out/probe12.log 2>&1; step "probe12 rc=$?"
step old12; (cd /tmp/tree_old && timeout 100 $P --heads 12/2 --parts full,pass2_gluon --taus 0,0.005,0.01,0.02 --rev 6059204 --out /tmp/rec_old > /tmp/out/old12.log 2>&1); step "old12 rc=$?"
step ncu; timeout 360 /usr/local/cuda/bin/ncu --csv --page details -k regex:_s2o_ --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python3 -m benchmarks.kernel_probe --once --length 131072 --heads 32/8 --taus 0,0.005 --parts pass1,pass2_gluon --rev $REV --out /tmp/rec_ncu > /tmp/out/ncu_sections.csv 2> /tmp/out/ncu.err; step "ncu rc=$?"
for h in 12/2 32/8; do
  step "crossover $h"; timeout 240 python3 -m benchmarks.crossover --method s2o --heads $h --head-dim 128 --rev $REV --out /tmp/rec > /tmp/out/crossover_${h/\//_}.log 2>&1; step "crossover $h rc=$?"
done
step ALL_DONE
