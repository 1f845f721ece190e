#!/usr/bin/env bash
# Call 3: the split attention kernel's variants timed alone (unroll, launch bounds), registers.
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
i=0
for def in "" "HF_ATTN_UNROLL=8" "HF_ATTN_MINB=4" "HF_ATTN_UNROLL=8 HF_ATTN_MINB=4"; do
  args=(); for d in $def; do args+=(--define "$d"); done
  timeout 100 dev-lead/at-new --depths 1024,4096,16384 --iters 320 "${args[@]}" --json $OUT/at-$i.jsonl > /dev/null 2>$OUT/at-$i.err || echo "variant $i rc $?"
  ( cd kernels && nvcc -arch=sm_90 -Xptxas -v -c decode.cu -o /tmp/d.o $(for d in $def; do echo -D$d; done) 2>&1 | grep -A1 "attention_slots_f16kv_g[24]" | grep -E "registers|spill" | sed "s/^/v$i /" )
  i=$((i+1))
done > $OUT/regs.log 2>&1
