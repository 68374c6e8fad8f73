#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_min/*.whl > /dev/null 2>&1 || { echo pip failed; exit 1; }
. local/gpu/env.sh; cd local/gpu/tree
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee $OUT/env.txt
python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,torch.version.cuda,transformers.__version__)" | tee -a $OUT/env.txt
timeout 330 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$?" | tee -a $OUT/gpu_tests.txt
tail -30 $OUT/gpu_tests.txt
