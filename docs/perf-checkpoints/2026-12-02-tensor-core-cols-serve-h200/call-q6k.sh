#!/usr/bin/env bash
# Q6_K tensor-core multi-column kernel: kernel bench, then the multi-column GEMV tests.
set -uo pipefail
: "${OUT:?}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d3; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle3.tgz -C $B
{
  cat $B/MANIFEST
  for c in 8 16 2; do
    echo "== cols $c ($(el) s)"
    timeout 60 $B/bin/gpu_bench --formats q6_k,q4_k --shapes 4096x4096,1024x4096,14336x4096,4096x14336 \
      --cols $c --config 4x2x1x1 --config 4x2x1x1:notc --host-configs 0 --reps 9 --json $OUT/kernel-q6-c$c.json 2>&1 | grep -E "^\|"
  done
} > $OUT/kernel-q6.log 2>&1
{
  echo "== gpu_gemv multi-column ($(el) s)"
  timeout 200 $B/tests/hipfire-gpu--gpu_gemv --test-threads 1 --nocapture multi_column 2>&1 |
    grep -E "^test |panicked|FAILED|test result|columns 1..16|q6_k.*column" | cut -c1-200
  echo "done $(el) s"
} > $OUT/tests-gemv-q6.log 2>&1
grep -E "q6_k" $OUT/kernel-q6.log; grep -E "test result|panicked" $OUT/tests-gemv-q6.log; grep -c "tensor-core bound" $OUT/tests-gemv-q6.log
