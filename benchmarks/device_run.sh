#!/usr/bin/env bash
# The GPU benchmarks in parts, each under its own time limit, saving as they go; results go
# to benchmarks/results/ and, when $OUT is set, are copied there after each part.
#   bash benchmarks/device_run.sh [PARTS] [MODEL]
# PARTS (comma-separated, in order; default tune,decode,long):
#   tune        `locals tune` on MODEL's layer shapes, rows 8,16,32,4,2 then the rest, each stopped
#               after $TUNE_SECONDS (240) with what it measured saved, so the next parts run tuned;
#               TUNE_ONLY=qmma,... tries only those candidates (and MLX's op)
#   usertune    `locals tune` on MODEL's layer shapes as a user runs it (its defaults), timed, stopped
#               after $TUNE_SECONDS (300)
#   serve       serve_traffic.py: `locals serve` against `mlx_lm.server` over HTTP ($SERVE_ARGS added,
#               e.g. --quick); NO_TABLE=1 moves this chip's tuning table aside for the run (a tuned
#               server against an untuned one, each a call of its own)
#   head        `locals tune` on the tied lm_head (vocab x hidden) alone, the two tensor-core
#               candidates that win the layers, rows 8,4,2,16,32, stopped after $TUNE_SECONDS (240)
#   gated       gated_kernel (SwiGLU inside the gate/up kernel against its product + MLX's
#               activation, rows 2..16), then batch_decode B = 4,8,16 with and without it, 5 rounds
#   whole       batch_decode B = 1..32 with each decode step one compiled graph against compiled seams
#               around eager attention (an engine each) and mlx-lm, rows all at 64 tokens, then at 64..512
#   cachewrite  batch_decode B = 8,1,16,32 with K/V written by the q/k kernel against a scatter a layer
#               (an engine each) and mlx-lm; step_ops of both
#   decode      batch_decode B = 1..32, locals (tuned) vs locals untuned vs locals with q/k/v and
#               gate/up apart vs mlx-lm, 3 rounds
#   ragged      batch_decode B = 8,32 with prompts of 64..256 tokens (rows at different lengths:
#               attention with a mask, which MLX's CUDA vector kernel does not take)
#   attention   batch_decode B = 1,8,32, rows at 64..512 tokens then all at 64, with the decode attention
#               kernel vs MLX's attention (an engine each) vs mlx-lm
#   profile     step_profile B = 1,4,8,32 (phases of a decode step); LENGTH_SPREAD=448 puts rows at
#               64..512 tokens; VARIANTS=locals,seams adds compiled seams (step_profile --variants)
#   donation    kv_donation: does a K/V write copy the cache while the step before still runs?
#   parts       step_parts B = 1,4,8: each part of a step in MLX itself (matmuls on mlx-lm's
#               (B, 1, hidden) input and on the engine's flat one, attention, lm_head, ...)
#   kernels     step_kernels B = 1,8: the GPU kernels of an engine step and their device time,
#               under Nsight Compute (ncu on PATH, or NCU=/path/to/ncu); KERNEL_BYTES=1 adds DRAM bytes
#   mixed       mixed_pass: what forced chunks and drafts add to a B = 8 decode pass
#   mixedprompt mixed_pass --prompt: prompt chunks of 24, 56, 120 and 248 tokens (after 4,096 cached)
#               beside 8 rows decoding at 6,000, alone, the chunk's attention as served and fused, and
#               the pass's matmuls, and the chunk advancing (caches growing or reserved); under
#               $MIXED_TIMEOUT (400) s
#   spread      process_spread: B = 8 and 32 in four fresh processes (the per-process spread)
#   long        long_prompt: an 8k-token prompt arriving while 4 streams decode
#   constraint  constraint.py on the embedded model (engine and loop, no compile timings)
#   tests       tests/kernels/test_kernels_cuda.py in two halves (each kernel configuration against its
#               reference, then the rest), each under $TESTS_TIMEOUT (280) s, a JUnit report each
# MODEL: qwen3-4b (default) on a GPU; qwen3-tiny tries the script out on a CPU.
set -u
cd "$(dirname "$0")/.."
parts=${1:-tune,decode,long}
model=${2:-qwen3-4b}
long=${LONG_TOKENS:-8192}
python3 -c 'import mlx.core as mx; print("device:", mx.default_device(), mx.__version__)'
stamp=$(mktemp)  # only this run's results go to $OUT (all of them would pass what comes back)
save() { if [ -n "${OUT:-}" ]; then find benchmarks/results \( -name '*.json' -o -name '*.xml' \) -newer "$stamp" -exec cp {} "$OUT"/ \;; fi; }
shapes() {
  # The quantized layers the engine runs for a random Qwen3 of this shape: joined q/k/v, o,
  # joined gate/up, down (locals/engine/forward/fuse.py), and the tied lm_head (vocab x hidden).
  python3 - "$model" <<'PY'
import sys
from benchmarks.common import QWEN3_SHAPES
s = QWEN3_SHAPES[sys.argv[1]]
h, i, q, kv = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
shapes = {(q + 2 * kv, h), (h, q), (2 * i, h), (h, i), (s["vocab_size"], h)}
print(" ".join(f"--shape {n}x{k}" for n, k in sorted(shapes)))
PY
}
for part in ${parts//,/ }; do
  echo "== $part"
  case $part in
    tune) # The row counts that matter most first, then the rest, each stopped with what it measured saved.
      timeout -s TERM -k 30 "${TUNE_SECONDS:-240}" python3 -m locals tune $(shapes) --rounds 3 --rows 8,16,32,4,2 ${TUNE_ONLY:+--only $TUNE_ONLY}
      timeout -s TERM -k 30 "${TUNE_SECONDS:-240}" python3 -m locals tune $(shapes) --rounds 3 --rows 2-32 ${TUNE_ONLY:+--only $TUNE_ONLY} ;;
    usertune) start=$(date +%s)
      timeout -s TERM -k 30 "${TUNE_SECONDS:-300}" python3 -m locals tune $(shapes); rc=$?
      echo "locals tune: $(( $(date +%s) - start )) s (exit $rc)" ;;
    serve) table=$(python3 -c 'from locals.engine.kernels.tuning.tuner import current_chip, table_path
from locals.engine.load.backend import mlx_version; print(table_path(current_chip()[1], mlx_version()))')
      if [ -n "${NO_TABLE:-}" ] && [ -f "$table" ]; then mv "$table" "$table.aside"; fi
      echo "tuning table: $([ -f "$table" ] && echo "$table" || echo none)"
      timeout 580 python3 benchmarks/serve_traffic.py ${SERVE_ARGS:-}
      if [ -f "$table.aside" ]; then mv "$table.aside" "$table"; fi
      # its server logs too:
      if [ -n "${OUT:-}" ]; then find benchmarks/results -name '*-logs' -newer "$stamp" -exec cp -r {} "$OUT"/ \;; fi ;;
    head) lm_head=$(shapes | tr ' ' '\n' | grep x | sort -n | tail -1)  # vocab x hidden: the largest shape
      timeout -s TERM -k 30 "${TUNE_SECONDS:-240}" python3 -m locals tune --shape "$lm_head" --rounds 3 \
        --rows 8,4,2,16,32 --only qmma-r16-t128,qmma-r16-t256 ;;
    gated) timeout 120 python3 benchmarks/gated_kernel.py --rows 2,4,8,16 --rounds 5
      save
      timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 4,8,16 --tokens 64 --prompt-len 64 --rounds 5 --ungated-baseline ;;
    whole) timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 8,1,32,2,4,16 --tokens 64 --prompt-len 64 --rounds 3 --seams-baseline
      save
      timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 8,32 --tokens 64 --prompt-len 64 --length-spread 448 --rounds 3 --seams-baseline ;;
    cachewrite) timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 8,1,16,32 --tokens 64 --prompt-len 64 --rounds 3 --scatter-baseline
      save
      timeout 200 python3 benchmarks/step_ops.py --random-model "$model" --batches 8,1 --tokens 12 \
        --variants locals,scatter ;;
    decode) timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 1,2,4,8,16,32 --tokens 32 --prompt-len 64 --rounds 3 --untuned-baseline --unfused-baseline ;;
    ragged) timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 8,32 --tokens 32 --prompt-len 64 --length-spread 192 --rounds 3 ;;
    attention) timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 1,8,32 --tokens 64 --prompt-len 64 --length-spread 448 --rounds 3 --mlx-attention-baseline
      save
      timeout "${DECODE_TIMEOUT:-240}" python3 benchmarks/batch_decode.py --random-model "$model" \
      --batches 8,32 --tokens 64 --prompt-len 64 --rounds 3 --mlx-attention-baseline ;;
    parts) timeout "${PARTS_TIMEOUT:-240}" python3 benchmarks/step_parts.py --random-model "$model" \
      --batches 1,4,8 --repeats 10 ;;
    donation) timeout 120 python3 benchmarks/kv_donation.py --tokens 8192 --steps 20 --work 8192 ;;
    profile) timeout "${PROFILE_TIMEOUT:-150}" python3 benchmarks/step_profile.py --random-model "$model" \
      --batches 1,4,8,32 --tokens 32 --variants ${VARIANTS:-locals} ${LENGTH_SPREAD:+--length-spread $LENGTH_SPREAD} ;;
    kernels) timeout "${KERNELS_TIMEOUT:-300}" python3 benchmarks/step_kernels.py --random-model "$model" \
      --batches "${KERNEL_BATCHES:-1,8}" --steps 4 --ncu "${NCU:-ncu}" --timeout 130 ${KERNEL_BYTES:+--bytes} ;;
    mixed) timeout 120 python3 benchmarks/mixed_pass.py --random-model "$model" --rounds 15 ;;
    spread) timeout "${SPREAD_TIMEOUT:-300}" python3 benchmarks/process_spread.py --random-model "$model" \
      --batches 8,32 --processes 4 ;;
    mixedprompt) timeout "${MIXED_TIMEOUT:-400}" python3 benchmarks/mixed_pass.py --random-model "$model" --batch 8 \
        --context 6000 --prompt 24,56,120,248 --prompt-at 4096 --rounds 8 ;;
    long) timeout "${LONG_TIMEOUT:-200}" python3 benchmarks/long_prompt.py --random-model "$model" --long "$long" --rounds 2 ;;
    constraint) timeout "${CONSTRAINT_TIMEOUT:-300}" python3 benchmarks/constraint.py --steps 48 --steps-only \
      --engine-tokens 400 --rounds 3 ;;
    tests) mkdir -p benchmarks/results
      for half in "candidate_matches_reference" "not candidate_matches_reference"; do
        timeout "${TESTS_TIMEOUT:-280}" python3 -m pytest -q tests/kernels/test_kernels_cuda.py -k "$half" --durations 10 \
          --junitxml "benchmarks/results/cuda_tests-$(date +%Y%m%d-%H%M%S).xml"
        save
      done ;;
    *) echo "unknown part: $part (see the comment at the top)"; exit 2 ;;
  esac
  save
done
