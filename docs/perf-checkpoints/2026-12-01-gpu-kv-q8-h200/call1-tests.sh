#!/usr/bin/env bash
# Call A: llama-bench builds in the background; register counts, attention timing, GPU tests.
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
R=/root/raw; rm -rf $R; mkdir -p $R
{ cat $B/MANIFEST; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv; nproc; grep -m1 "model name" /proc/cpuinfo; } > $R/env.txt 2>&1
src=/root/llama.cpp
if [[ ! -x $src/build/bin/llama-bench ]]; then
( rm -rf $src; tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-bench -j 14 >/root/llama-build.log 2>&1; echo "llama build rc $? at $(el) s" > /root/llama-done ) &
fi
L8B=/root/l8b.gguf
[[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --ctx-len 32768 --out $L8B > $R/synth.log 2>&1
{
echo "== registers ($(el) s)"
nvcc -arch=sm_90 -cubin -Xptxas -v -I kernels kernels/decode.cu -o /tmp/d.cubin 2>&1 | grep -A1 "attention_s" | grep -E "Compiling|registers|spill" | paste - - | sed 's/ptxas info    ://g' | head -40
nvcc -arch=sm_90 -cubin -Xptxas -v -I kernels kernels/prefill.cu -o /tmp/p.cubin 2>&1 | grep -A1 "attention_prefill" | grep -E "Compiling|registers|spill" | paste - - | sed 's/ptxas info    ://g'
} > $OUT/regs.log 2>&1
{
for t in f16 q8_0; do
  echo "== attention_timing $t ($(el) s)"
  timeout 90 $B/bin/attention_timing --cache-type $t --depths 1024,4096,16384 --iters 320 --json $R/attention-$t.jsonl 2>&1 | grep -E "planned|device" || echo "rc $?"
done
} > $OUT/timing.log 2>&1
{
run() { local t=$1; shift; left=$(( 470 - $(el) )); (( left < 20 )) && { echo "== $t skipped (time)"; return; }
  echo "== $t ($(el) s, up to $left s)"
  timeout $left $B/tests/hipfire-model--$t --test-threads 1 --nocapture "$@" 2>&1 |
    grep -E "^test |panicked|FAILED|test result|error|\"|captures|worst|q8_0|max \|" | head -80; }
run gpu_kv_q8
run hipfire_model chunk_attention
run gpu_attention
run gpu_decode_graphs
run gpu_prefill
run gpu_batch_decode
run gpu_synth
echo "tests done $(el) s"
} > $OUT/tests.log 2>&1
while [[ ! -f /root/llama-done ]] && (( $(el) < 560 )); do sleep 5; done
cat /root/llama-done >> $OUT/tests.log 2>&1; tail -2 /root/llama-build.log >> $OUT/tests.log 2>&1
tar czf $OUT/raw.tgz -C /root raw
