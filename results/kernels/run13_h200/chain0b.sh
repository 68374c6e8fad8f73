# started on GPU 0 at 17:59 by one call, after chain0 ended: the crossover records at 6059204's code
# (/tmp/tree_old: the tree of 18009d4 with 6059204's gluon_walk.py, i.e. 6059204's code)
. /tmp/common.sh; cd /tmp/tree_old; export S2O_GIT_REV=6059204
for h in 32/8 12/2; do step "crossover $h"; timeout 400 python3 -m benchmarks.crossover --method s2o --heads $h --head-dim 128 --rev 6059204 --out /tmp/rec_old > /tmp/out/crossover_old_${h/\//_}.log 2>&1; step "crossover $h rc=$?"; done
step ALL_DONE
