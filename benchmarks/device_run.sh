#!/usr/bin/env bash
# Every engine benchmark on a GPU machine in one go (random-weight 4-bit Qwen3-4B shape);
# results go to benchmarks/results/ and, when $OUT is set, are copied there too.
#   bash benchmarks/device_run.sh [qwen3-4b]      (qwen3-tiny tries it out on a CPU)
set -u
cd "$(dirname "$0")/.."
model=${1:-qwen3-4b}
long=${LONG_TOKENS:-8192}
python3 -c 'import mlx.core as mx; print("device:", mx.default_device())'
timeout ${DECODE_TIMEOUT:-300} python3 benchmarks/batch_decode.py --random-model "$model" \
  --batches 1,2,4,8,16,32 --tokens 32 --prompt-len 64 --rounds 2
timeout ${LONG_TIMEOUT:-200} python3 benchmarks/long_prompt.py --random-model "$model" --long "$long" --rounds 2
timeout ${LONG_TIMEOUT:-200} python3 benchmarks/long_prompt.py --random-model "$model" --long "$long" --rounds 2 --budget 1024
if [ -n "${OUT:-}" ]; then cp benchmarks/results/*.json "$OUT"/ 2>/dev/null; fi
