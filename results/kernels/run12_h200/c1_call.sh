#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_min/*.whl > /dev/null 2>&1 || { echo pip failed; exit 1; }
. local/gpu/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee $OUT/env.txt
python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,torch.version.cuda,transformers.__version__)" | tee -a $OUT/env.txt
(cd local/gpu/tree && timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py -k gluon > $OUT/gluon_tests_main.txt 2>&1; echo "main rc=$?" | tee -a $OUT/gluon_tests_main.txt)
(cd local/gpu/tree_ov && S2O_GIT_REV=f8c422b timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py -k gluon > $OUT/gluon_tests_ov.txt 2>&1; echo "ov rc=$?" | tee -a $OUT/gluon_tests_ov.txt)
tail -4 $OUT/gluon_tests_main.txt $OUT/gluon_tests_ov.txt
