#!/bin/bash
# device call 2: the GGUF whole again, then generation bench, ReST, GRPO, GRPO under accelerate on CUDA
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=/tmp/site:$PWD/src
ls /tmp/w/part /tmp/site >/dev/null || { echo "call 1's files are gone"; exit 3; }
cat /tmp/w/part .wts/b/part > /tmp/w/smollm2.gguf && sha256sum /tmp/w/smollm2.gguf
M=local:/tmp/w/smollm2.gguf
T=jsonl:.wts/easy.jsonl
step() { echo "=== $1 ($(date +%T))"; }
step generation
/usr/bin/time -f "%e s wall" python3 benchmarks/bench_generation.py --device cuda --model /tmp/w/smollm2.gguf \
    --task jsonl:.wts/gen64.jsonl --repeats 3 --out $OUT/generation_cuda.json 2>&1 | grep -v "Loading weights" | tail -25
step rest
/usr/bin/time -f "%e s wall" python3 -m selftaught train --method rest --task $T --model $M --rounds 2 -k 4 \
    --max-tokens 64 --device cuda --output /tmp/r/rest --quiet 2>&1 | grep -v "Loading weights" | tail -25
cp /tmp/r/rest/history.jsonl $OUT/rest_history.jsonl
step grpo
/usr/bin/time -f "%e s wall" python3 -m selftaught train --method grpo --task $T --model $M --steps 10 \
    --max-tokens 64 --device cuda --output /tmp/r/grpo --quiet 2>&1 | grep -v "Loading weights" | tail -25
cp /tmp/r/grpo/history.jsonl $OUT/grpo_history.jsonl
step accelerate
/usr/bin/time -f "%e s wall" accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    -m selftaught.cli train --method grpo --task $T --model $M --steps 4 --max-tokens 64 --device cuda \
    --output /tmp/r/grpo_acc --quiet 2>&1 | grep -v "Loading weights" | tail -25
cp /tmp/r/grpo_acc/history.jsonl $OUT/grpo_accelerate_history.jsonl
step done
