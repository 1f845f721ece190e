#!/usr/bin/env bash
# Call 2: llama-bench (FA on) builds in the background while attention timing (old vs new
# kernel) and the GPU tests run; then decode at depth: hipfire (this tree), llama-bench -fa 1,
# hipfire at 3af0044 (graphs, previous attention kernel), same file, same call.
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
xz -dc dev-lead/hipfire-3af0044.xz > /root/hipfire-prev && chmod +x /root/hipfire-prev
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
echo "== gpu_attention ($(el) s)"
timeout 120 $B/tests/hipfire-model--gpu_attention --test-threads 1 --nocapture 2>&1 |
  grep -E "^test |panicked|FAILED|test result|error|\"|depth 4096|row 3" | head -60
for a in old new; do
  echo "== attention_timing $a ($(el) s)"
  timeout 90 dev-lead/at-$a --depths 1024,4096,16384 --iters 320 --json $OUT/at-$a.jsonl > /dev/null 2>&1 || echo "rc $?"
done
for t in gpu_decode_graphs gpu_batch_decode gpu_prefill gpu_synth; do
  left=$(( 330 - $(el) )); (( left < 20 )) && { echo "== $t skipped (time)"; continue; }
  echo "== $t ($(el) s, up to $left s)"
  timeout $left $B/tests/hipfire-model--$t --test-threads 1 2>&1 |
    grep -E "^test |panicked|FAILED|test result|error|\"" | head -40
done
echo "tests done $(el) s"
} > $OUT/tests.log 2>&1
wait $BPID; echo "llama build rc $? at $(el) s" >> $OUT/synth.log
tail -1 /root/llama-build.log >> $OUT/synth.log
D=16,1024,4096,16384
{
echo "new start $(el)"
timeout 120 $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3 --json > $OUT/hf-new.json 2>$OUT/hf-new.err
echo "llama start $(el)"
timeout 150 $src/build/bin/llama-bench -m $L8B -p 0 -n 32 -d $D -ngl 99 -fa 1 -r 3 -o json > $OUT/llama-fa1.json 2>/dev/null
echo "prev start $(el)"
timeout 120 /root/hipfire-prev bench $L8B --device gpu -p 0 -n 32 -d $D -r 3 --json > $OUT/hf-prev.json 2>/dev/null
echo "done $(el)"
tail -c 600 $OUT/hf-new.err
} > $OUT/bench.log 2>&1
rm -f $OUT/hf-new.err
