#!/usr/bin/env bash
# The device call of this record, run from the repository root on the GPU box.
#   call.sh serve: llama-server built (FA on) while the GPU tests of batched decode run (TESTS
#     overrides which: gpu_batch_decode drives prompts and a refill riding along as rows of
#     decode_segments steps against the CPU and the staged path; gpu_decode_graphs checks the
#     replayed steps beside them); then hipfire serve and llama-server under the same load (the
#     serve record's run.sh: 16 of 32 layers spilled, passback, 1/4/8/16 streams), nothing else
#     running; then, while time is left, the previous main's hipfire serve (b5e870a, every prompt
#     a staged prefill step) at 1 and 8 streams under the same load, into base/.
# Issue 19's target: aggregate tok/s at 8 streams >= 4 x one stream (3.89 x at b5e870a).
# It reads what the call carried in an untracked dev-lead/ folder: bundle.txz (bin/hipfire,
# MANIFEST and GPU test executables from `scripts/device-check.sh build`),
# llama.cpp-src.tar.gz (the llama-cpp-python 0.3.36 sdist's vendored source) and
# hipfire-base.xz (b5e870a's binary; the base run is skipped without it).
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PART=${1:?serve}
[[ $PART == serve ]] || { echo "usage: call.sh serve" >&2; exit 2; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
BASE=
if [[ -f dev-lead/hipfire-base.xz ]]; then
  xz -dc dev-lead/hipfire-base.xz > /root/hipfire-base && chmod +x /root/hipfire-base && BASE=/root/hipfire-base
fi
L8B=/root/l8b.gguf
[[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1
tests() {
  for t in ${TESTS:-hipfire-model--gpu_batch_decode hipfire-model--gpu_decode_graphs}; do
    set -- $t; n=$1; shift
    echo "== $n $* ($(el) s)"
    timeout 300 $B/tests/$n --test-threads 1 --nocapture "$@" 2>&1 |
      grep -E "^test |panicked|assert|left|right|FAILED|test result|error|batched vs|over the bound|max \|" | head -120
  done
  echo "tests done $(el) s"
}
# The previous main's server under the same load, hipfire only, 1 and 8 streams.
base_serve() {
  local D=$OUT/base; mkdir -p $D
  HIPFIRE_HOME=$(mktemp -d) $BASE serve $L8B --device gpu --gpu-layer-budget 16 --offload-exec passback \
    --parallel 16 --ctx-size 1024 --port 18196 >/dev/null 2>>$D/serve-hipfire.log &
  local P=$!
  for _ in $(seq 900); do curl -sf http://127.0.0.1:18196/health >/dev/null && break; sleep 0.2; done
  for c in 1 8; do
    python3 scripts/serve_load.py --url http://127.0.0.1:18196 --concurrency $c --seconds ${SECS:-15} \
      --max-tokens 64 --label "hipfire-base c$c" | tee -a $D/serve-raw.jsonl; echo
  done
  curl -s http://127.0.0.1:18196/metrics > $D/serve-hipfire-metrics.txt
  kill -TERM $P; wait $P
}
src=/root/llama.cpp
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=ON \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-server -j 15 >/root/llama-build.log 2>&1 ) &
BPID=$!
tests > $OUT/tests.log 2>&1
wait $BPID; echo "llama build rc $? at $(el) s" >> $OUT/synth.log
tail -2 /root/llama-build.log >> $OUT/synth.log
COMMIT=$(head -1 $B/MANIFEST) bash docs/perf-checkpoints/2026-12-01-serve-gpu-h200/run.sh \
  $B/bin/hipfire $src/build/bin/llama-server $L8B ${SECS:-15}
echo "serve done $(el) s" >> $OUT/serve-env.txt
[[ -n $BASE ]] && (( $(el) < 480 )) && base_serve
echo "done $(el) s" >> $OUT/serve-env.txt
