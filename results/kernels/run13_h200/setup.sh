#!/bin/bash
# call 1 on an x4 machine: wheels, trees, then four background chains (one per GPU) and the model assembler
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_min/*.whl > /dev/null 2>&1 || { echo pip failed; exit 1; }
rm -rf /tmp/tree /tmp/tree_old /tmp/out && cp -r local/gpu/tree /tmp/tree && cp -r local/gpu/tree /tmp/tree_old && cp local/gpu/old_gluon_walk.py /tmp/tree_old/s2o/kernels/gluon_walk.py
cp local/gpu/*.sh /tmp/ && mkdir -p /tmp/q /tmp/out /tmp/res /tmp/rec /tmp/rec_old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/out/env.txt
python3 -c "import torch,triton,transformers,sys;print(torch.__version__,triton.__version__,torch.version.cuda,transformers.__version__,sys.version.split()[0])" >> /tmp/out/env.txt
python3 -c "import os,pydoc_data;print(os.__file__, pydoc_data.__file__)" >> /tmp/out/env.txt 2>&1
cat /tmp/out/env.txt
for c in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$c setsid nohup bash /tmp/chain$c.sh > /tmp/out/chain$c.log 2>&1 < /dev/null & done
setsid nohup bash /tmp/assemble.sh > /tmp/out/assemble.log 2>&1 < /dev/null &
echo started
