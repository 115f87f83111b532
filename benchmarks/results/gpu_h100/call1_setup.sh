#!/bin/bash
# device call 1: wheels into /tmp/site, first half of the GGUF into /tmp/w, environment probe
set -u
mkdir -p /tmp/w && cp .wts/a/part /tmp/w/part && ls -la /tmp/w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
python3 -V
python3 -c "import torch,transformers,trl,peft,datasets,accelerate,gguf,selftaught;print('torch',torch.__version__,'transformers',transformers.__version__,'trl',trl.__version__,'peft',peft.__version__,'datasets',datasets.__version__,'accelerate',accelerate.__version__,torch.cuda.get_device_name())"
python3 -m pip list 2>/dev/null | grep -iE "^(pyarrow|huggingface.hub|tokenizers|typer|rich|vllm) "
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
