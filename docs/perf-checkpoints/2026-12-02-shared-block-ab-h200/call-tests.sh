#!/usr/bin/env bash
# Device call: the GPU tier after the GPU-engine seam (hipfire_exec::GpuEngine) and the layer
# placement type: executor splits, GPU decode vs the CPU path in every mode, batched decode,
# batched prefill, graphs, the decoder's unit tests.
set -uo pipefail
: "${OUT:?}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d3; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle3.tgz -C $B
{
  echo "commit $(cat $B/MANIFEST)"
  for spec in "40 hipfire_exec--gpu_offload" "60 hipfire_model--gpu_batch_decode" "40 hipfire_model--gpu_prefill" \
              "30 hipfire_model--gpu_decode_graphs" "30 hipfire_model--lib gpu::" "150 hipfire_model--gpu_synth"; do
    set -- $spec; lim=$1; n=$2; shift 2
    echo "== $n $* ($(el) s)"
    timeout $lim $B/tests/$n --test-threads 1 "$@" 2>&1 | grep -E "^test |panicked|FAILED|test result" | head -40
  done
  echo "done $(el) s"
} > $OUT/tests.log 2>&1
cat $OUT/tests.log
