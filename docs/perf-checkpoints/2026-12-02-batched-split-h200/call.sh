#!/usr/bin/env bash
# The device calls of this record, run from the repository root on the GPU box.
#   call.sh check: the GPU tests of the batched split (hipfire-exec's gpu_offload) and of
#     batched decode, then `hipfire bench --batch` of the previous main (28dae5a) and of this
#     tree, interleaved, 16 of 32 layers spilled; then the CPU GEMV of every format against a
#     plain read of the same bytes at 16 threads (issue 21's target), DRAM-fed.
#   call.sh serve: llama-server built (FA on) while the same GPU tests run (TESTS overrides
#     which) and, with INVARIANCE=1, hipfire serve's batch invariance is checked
#     (scripts/serve_invariance.py, 8 prompts alone then at once); then hipfire serve and
#     llama-server under the same load (the serve record's run.sh), nothing else running; then
#     the bench A/B at 16 spilled while time is left.
# It reads what the call carried in an untracked dev-lead/ folder: bundle.txz (bin/hipfire,
# bin/gemv_gbs, MANIFEST and GPU test executables from `scripts/device-check.sh build`),
# llama.cpp-src.tar.gz (the llama-cpp-python 0.3.36 sdist's vendored source) and
# hipfire-base.xz (28dae5a's binary).
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PART=${1:?check or serve}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
xz -dc dev-lead/hipfire-base.xz > /root/hipfire-base && chmod +x /root/hipfire-base
L8B=/root/l8b.gguf
[[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1
tests() {
  for t in ${TESTS:-hipfire-exec--gpu_offload hipfire-model--gpu_batch_decode}; do
    set -- $t; n=$1; shift
    echo "== $n $* ($(el) s)"
    timeout 200 $B/tests/$n --test-threads 1 --nocapture "$@" 2>&1 |
      grep -E "^test |panicked|assert|left|right|FAILED|test result|error|batched vs|max \|" | head -80
  done
  echo "tests done $(el) s"
}
# Engine time alone: B sequences stepped by batched decode, old and new interleaved.
bench() {
  local R=$OUT/bench.jsonl; touch $R
  for round in 1 2; do
    for bin in /root/hipfire-base $B/bin/hipfire; do
      tag=new; [[ $bin == /root/hipfire-base ]] && tag=base
      timeout 120 $bin bench $L8B --device gpu --gpu-layer-budget 16 --offload-exec passback -p 0 -n 32 -r 2 \
        --batch 1,4,8,16 --json 2>>$OUT/bench.log | python3 -c "
import sys, json
for r in json.load(sys.stdin):
    print(json.dumps({'bin': '$tag', 'round': $round, 'budget': 16, 'test': r['test'], 'ts': r['avg_ts'], 'sd': r.get('stddev_ts')}))" >> $R
      echo "bench $tag round $round done $(el) s" >> $OUT/bench.log
    done
  done
}
# CPU GEMV of each format at 16 threads against a plain read of the same bytes, same run,
# 2 GiB of copies (past the L3), best of 7 passes each.
formats() {
  for k in 4096 14336; do
    $B/bin/gemv_gbs --formats q4_0,q4_1,q8_0,q4_k,q6_k,q5_0,q5_1,q5_k,q3_k,q2_k,iq4_nl,iq4_xs \
      --k $k --m 4096 --threads 16 --footprint-mib 2048 --reps 7
  done
}
if [[ $PART == check ]]; then
  tests > $OUT/tests.log 2>&1
  bench
  formats > $OUT/formats.log 2>&1
  echo "done $(el) s" >> $OUT/bench.log
  exit 0
fi
src=/root/llama.cpp
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=ON \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-server -j 15 >/root/llama-build.log 2>&1 ) &
BPID=$!
tests > $OUT/tests.log 2>&1
if [[ ${INVARIANCE:-0} == 1 ]]; then
  HIPFIRE_HOME=$(mktemp -d) $B/bin/hipfire serve $L8B --device gpu --gpu-layer-budget 16 \
    --offload-exec passback --parallel 16 --ctx-size 1024 --port 18194 >/dev/null 2>>$OUT/tests.log &
  SP=$!
  for _ in $(seq 900); do curl -sf http://127.0.0.1:18194/health >/dev/null && break; sleep 0.2; done
  python3 scripts/serve_invariance.py --url http://127.0.0.1:18194 --concurrency 8 >> $OUT/tests.log 2>&1
  kill -TERM $SP; wait $SP
  echo "invariance done $(el) s" >> $OUT/tests.log
fi
wait $BPID; echo "llama build rc $? at $(el) s" >> $OUT/synth.log
tail -2 /root/llama-build.log >> $OUT/synth.log
COMMIT=$(head -1 $B/MANIFEST) bash docs/perf-checkpoints/2026-12-01-serve-gpu-h200/run.sh \
  $B/bin/hipfire $src/build/bin/llama-server $L8B ${SECS:-15}
echo "serve done $(el) s" >> $OUT/serve-env.txt
(( $(el) < 430 )) && bench
echo "done $(el) s" >> $OUT/serve-env.txt
