#!/usr/bin/env bash
# The record's final device call, run from the repository root on the GPU box. It reads what the
# call carried in the untracked dev-lead/ folder: bundle.txz (bin/hipfire, MANIFEST and GPU test
# executables from `scripts/device-check.sh build`), llama.cpp-src.tar.gz (the llama-cpp-python
# 0.3.36 sdist's vendored source), hipfire-e481bb9.xz (the release binary before this work) and
# at-new (hipfire-model's attention_timing example of this tree).
#   1. llama-bench (CUDA sm_90, FlashAttention kernels) builds in the background while
#      attention_timing and the GPU tests run.
#   2. Decode at depth 16 / 1024 / 4096 / 16384, every layer resident, one after another with
#      nothing else running: this tree, llama-bench -fa 1, this tree with graphs off
#      (HIPFIRE_DISABLE_GRAPHS=1), e481bb9.
#   3. Decode at depth 4096 with 8 / 16 / 24 of 32 layers spilled: this tree under passback,
#      llama-bench with the same layers on its CPU (-ngl 24/16/8, output on the GPU).
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
xz -dc dev-lead/hipfire-e481bb9.xz > /root/hipfire-e481bb9 && chmod +x /root/hipfire-e481bb9
R=/root/raw; rm -rf $R; mkdir -p $R
{ cat $B/MANIFEST; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv; nproc; grep -m1 "model name" /proc/cpuinfo; } > $R/env.txt 2>&1
L8B=/root/l8b.gguf
$B/bin/hipfire synth --arch llama3-8b --format q4_k --ctx-len 32768 --out $L8B > $R/synth.log 2>&1
src=/root/llama.cpp
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-bench -j 15 >/root/llama-build.log 2>&1 ) &
BPID=$!
{
echo "== attention_timing ($(el) s)"
timeout 60 dev-lead/at-new --depths 16,1024,4096,16384 --iters 320 --json $R/attention.jsonl > /dev/null 2>&1 || echo "rc $?"
for t in gpu_attention gpu_decode_graphs gpu_synth gpu_batch_decode; do
  left=$(( 270 - $(el) )); (( left < 20 )) && { echo "== $t skipped (time)"; continue; }
  echo "== $t ($(el) s, up to $left s)"
  timeout $left $B/tests/hipfire-model--$t --test-threads 1 --nocapture 2>&1 |
    grep -E "^test |panicked|FAILED|test result|error|\"|captures|worst|depth" | head -60
done
echo "tests done $(el) s"
} > $OUT/tests.log 2>&1
wait $BPID; echo "llama build rc $? at $(el) s" >> $R/synth.log
tail -1 /root/llama-build.log >> $R/synth.log
D=16,1024,4096,16384
hf() { local out=$1; shift; timeout 150 "$@" --json > $R/$out.json 2> $R/$out.err; echo "$out rc $? at $(el) s"; }
ll() { local out=$1; shift; timeout 150 $src/build/bin/llama-bench -m $L8B -o json "$@" > $R/$out.json 2> $R/$out.err; echo "$out rc $? at $(el) s"; }
{
hf resident-new $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3
ll resident-llama-fa1 -p 0 -n 32 -d $D -ngl 99 -fa 1 -r 3
hf resident-new-nographs env HIPFIRE_DISABLE_GRAPHS=1 $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3
hf resident-e481bb9 /root/hipfire-e481bb9 bench $L8B --device gpu -p 0 -n 32 -d $D -r 3
for b in 24 16 8; do
  hf spill$b-new $B/bin/hipfire bench $L8B --device gpu --gpu-layer-budget $b --offload-exec passback -p 0 -n 32 -d 4096 -r 2
  ll spill$b-llama-fa1 -p 0 -n 32 -d 4096 -ngl $b -ot output=CUDA0 -fa 1 -t 16 -r 2
done
} > $R/bench.log 2>&1
cp $R/bench.log $OUT/bench.log
tar czf $OUT/raw.tgz -C /root raw
