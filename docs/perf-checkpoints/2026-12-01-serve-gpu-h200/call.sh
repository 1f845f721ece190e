#!/usr/bin/env bash
# The device call of this record, run from the repository root on the GPU box: llama-server
# built (FA on) while the GPU tests run; then llama-server and hipfire serve under the same load
# on the same 8B synth (run.sh); then single-stream decode against cc708fe; then
# `hipfire bench --batch` (passback) for the per-batch shares. It reads what the call carried in
# an untracked dev-lead/ folder: bundle.txz (bin/hipfire, MANIFEST and the GPU test executables
# from `scripts/device-check.sh build`), llama.cpp-src.tar.gz (the llama-cpp-python 0.3.36
# sdist's vendored source) and hipfire-old.xz (cc708fe's binary).
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
L8B=/root/l8b.gguf
$B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1
src=/root/llama.cpp
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=ON \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-server -j 16 >/root/llama-build.log 2>&1 ) &
BPID=$!
{
echo "== batch decode ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/tests/hipfire-model--gpu_batch_decode --test-threads 1 --nocapture 2>&1 | grep -E "batched vs|test |panicked|assert|left|right|FAILED|over the bound|error" | head -80
echo "== gemv cols ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/tests/hipfire-gpu--gpu_gemv --test-threads 1 --nocapture multi_column prepare_cols 2>&1 | grep -v "^$" | tail -30
echo "tests done $(( $(date +%s) - T0 )) s"
} > $OUT/tests.log 2>&1
wait $BPID; echo "llama build rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/synth.log
tail -3 /root/llama-build.log >> $OUT/synth.log
COMMIT=$(head -1 $B/MANIFEST) bash docs/perf-checkpoints/2026-12-01-serve-gpu-h200/run.sh $B/bin/hipfire $src/build/bin/llama-server $L8B ${SECS:-15}
echo "serve done $(( $(date +%s) - T0 )) s" >> $OUT/serve-env.txt
# Single-stream decode against cc708fe (the project's decode baseline), one round each.
xz -dc dev-lead/hipfire-old.xz > /root/hipfire-old && chmod +x /root/hipfire-old
R=$OUT/ab.jsonl; : > $R
for b in 16 32; do
  m=passback; [[ $b == 32 ]] && m=pcie
  timeout 60 /root/hipfire-old bench $L8B --device gpu --gpu-layer-budget $b --offload-exec $m --prompt-tokens 16 --gen-tokens 64 --rounds 1 --json 2>>$OUT/ab.err |
    python3 -c "import sys,json; d=json.load(sys.stdin); print(json.dumps({'bin':'old','budget':$b,'tg':d['modes'][0]['decode_tok_s']['median']}))" >> $R
  timeout 60 $B/bin/hipfire bench $L8B --device gpu --gpu-layer-budget $b --offload-exec $m -p 0 -n 64 -r 1 --json 2>>$OUT/ab.err |
    python3 -c "import sys,json; d=json.load(sys.stdin); r=[x for x in d if x['test'].startswith('tg')][0]; print(json.dumps({'bin':'new','budget':$b,'tg':r['avg_ts']}))" >> $R
done
echo "ab done $(( $(date +%s) - T0 )) s" >> $OUT/serve-env.txt
if (( $(date +%s) - T0 < 520 )); then
  timeout $(( 580 - ($(date +%s) - T0) )) $B/bin/hipfire bench $L8B --device gpu --gpu-layer-budget 16 --offload-exec passback -p 0 -n 32 -r 2 --batch 1,4,8,16 --json \
     > $OUT/bench-16-passback.json 2> $OUT/bench.log
fi
echo "done $(( $(date +%s) - T0 )) s" >> $OUT/serve-env.txt
