#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_min/*.whl > /dev/null 2>&1 || { echo pip failed; exit 1; }
rm -rf /tmp/tree /tmp/out && cp -r local/gpu/tree /tmp/tree && cp local/gpu/env.sh local/gpu/chain.sh /tmp/ && mkdir -p /tmp/q /tmp/out /tmp/res /tmp/rec
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/out/env.txt
python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,torch.version.cuda,transformers.__version__)" >> /tmp/out/env.txt
cat /tmp/out/env.txt
setsid nohup bash /tmp/chain.sh > /tmp/out/chain.log 2>&1 < /dev/null &
echo started
