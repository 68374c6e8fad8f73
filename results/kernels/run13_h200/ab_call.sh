#!/bin/bash
# one call: the Gluon walk with the index prefetch (639cb11) against 6059204's walk, same machine
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_min/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc WANDB_MODE=disabled
P="python3 -m benchmarks.kernel_probe --length 131072 --heads 32/8 --parts pass2_gluon --taus 0,0.005 --rep-ms 300"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd local/gpu/tree && timeout 110 $P --rev 639cb11 --out $OUT/rec 2>&1 | grep -v '^ ' | tail -8)
(cd local/gpu/tree_old && timeout 110 $P --rev 6059204 --out $OUT/rec 2>&1 | grep -v '^ ' | tail -8)
(cd local/gpu/tree && timeout 60 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py -k gluon 2>&1 | tail -3)
