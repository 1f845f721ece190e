#!/usr/bin/env bash
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
R=/root/raw; rm -rf $R; mkdir -p $R
{ cat $B/MANIFEST; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; grep -m1 "model name" /proc/cpuinfo; } > $R/env.txt 2>&1
src=/root/llama.cpp
( rm -rf $src; tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-bench -j 15 >/root/llama-build.log 2>&1; echo "llama build rc $? at $(el) s" > /root/llama-done ) &
L8B=/root/l8b.gguf
$B/bin/hipfire synth --arch llama3-8b --format q4_k --ctx-len 32768 --out $L8B > $R/synth.log 2>&1
D=16,1024,4096,16384
hf() { local out=$1; shift; timeout 170 "$@" --json > $R/$out.json 2> $R/$out.err; echo "$out rc $? at $(el) s"; }
ll() { local out=$1; shift; timeout 170 $src/build/bin/llama-bench -m $L8B -o json "$@" > $R/$out.json 2> $R/$out.err; echo "$out rc $? at $(el) s"; }
{
echo "synth done $(el) s"
# Resident hipfire runs are GPU-bound (replayed graphs): they run while llama-bench compiles.
hf resident-f16-during-build $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3
hf resident-q8-during-build $B/bin/hipfire bench $L8B --device gpu --cache-type q8_0 -p 0 -n 32 -d $D -r 3
while [[ ! -f /root/llama-done ]] && (( $(el) < 420 )); do sleep 3; done
cat /root/llama-done
hf resident-f16 $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3
ll resident-llama-fa1 -p 0 -n 32 -d $D -ngl 99 -fa 1 -r 3
(( $(el) < 470 )) && hf resident-q8 $B/bin/hipfire bench $L8B --device gpu --cache-type q8_0 -p 0 -n 32 -d $D -r 3
for b in 24 16 8; do
  (( $(el) < 530 )) || break
  hf spill$b-f16 $B/bin/hipfire bench $L8B --device gpu --gpu-layer-budget $b --offload-exec passback -p 0 -n 32 -d 4096 -r 1
  ll spill$b-llama-fa1 -p 0 -n 32 -d 4096 -ngl $b -ot output=CUDA0 -fa 1 -t 16 -r 1
done
(( $(el) < 540 )) && ll resident-llama-fa1-q8 -p 0 -n 32 -d $D -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -r 2
(( $(el) < 560 )) && ll resident-llama-fa0 -p 0 -n 32 -d 16,1024,4096 -ngl 99 -fa 0 -r 2
echo "end $(el) s"
} > $R/bench.log 2>&1
cp $R/bench.log $OUT/bench.log
tar czf $OUT/raw.tgz -C /root raw
