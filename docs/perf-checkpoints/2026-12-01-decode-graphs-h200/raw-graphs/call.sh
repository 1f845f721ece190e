#!/usr/bin/env bash
# Call 1: llama-bench (FA on) builds in the background while the GPU tests run; then decode at
# depth: hipfire with graphs, llama-bench -fa 1, hipfire with graphs off (same file, same call).
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
L8B=/root/l8b.gguf
$B/bin/hipfire synth --arch llama3-8b --format q4_k --ctx-len 32768 --out $L8B > $OUT/synth.log 2>&1
src=/root/llama.cpp
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-bench -j 15 >/root/llama-build.log 2>&1 ) &
BPID=$!
{
for t in "hipfire-model--gpu_decode_graphs" "hipfire-model--gpu_attention" "hipfire-model--gpu_batch_decode" "hipfire-model--gpu_synth"; do
  left=$(( 380 - $(el) )); (( left < 20 )) && { echo "== $t skipped (time)"; continue; }
  echo "== $t ($(el) s, up to $left s)"
  timeout $left $B/tests/$t --test-threads 1 --nocapture 2>&1 |
    grep -E "^test |panicked|assert|left|right|FAILED|test result|error|captures|worst|vs one by one|resident" | head -60
done
echo "tests done $(el) s"
} > $OUT/tests.log 2>&1
wait $BPID; echo "llama build rc $? at $(el) s" >> $OUT/synth.log
tail -2 /root/llama-build.log >> $OUT/synth.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> $OUT/synth.log
D=16,1024,4096,16384
{
echo "graphs start $(el)"
timeout 150 $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3 --json > $OUT/hf-graphs.json 2>$OUT/hf-graphs.err
echo "llama start $(el)"
timeout 150 $src/build/bin/llama-bench -m $L8B -p 0 -n 32 -d $D -ngl 99 -fa 1 -r 3 -o json > $OUT/llama-fa1.json 2>$OUT/llama.err
echo "launch start $(el)"
HIPFIRE_DISABLE_GRAPHS=1 timeout 150 $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3 --json > $OUT/hf-launch.json 2>$OUT/hf-launch.err
echo "done $(el)"
} > $OUT/bench.log 2>&1
tail -c 1500 $OUT/hf-graphs.err >> $OUT/bench.log
