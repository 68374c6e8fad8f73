#!/bin/bash
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda)" | tee -a $OUT/env.txt
timeout 70 python3 local/gpu/ab.py gen /dev/shm/qkv.pt; echo gen rc=$?
timeout 80 python3 local/gpu/ab.py time local/gpu/tree /dev/shm/qkv.pt /tmp/old.json; echo old rc=$?
timeout 80 python3 local/gpu/ab.py time local/gpu/new /dev/shm/qkv.pt /tmp/new.json; echo new rc=$?
python3 local/gpu/ab.py compare /tmp/old.json /tmp/new.json $OUT/ab.json
cd local/gpu/new && timeout 120 python3 -m pytest -q -x -m gpu tests/test_kernels_gpu.py -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
