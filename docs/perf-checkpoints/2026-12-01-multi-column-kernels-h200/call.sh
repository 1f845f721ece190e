#!/usr/bin/env bash
# The device calls of this record, run from the repository root on the GPU box.
#   call.sh check: the GPU tests of the multi-column GEMV and the batched decode, then
#     `hipfire bench --batch` of the previous main (cb597eb) and of this tree, interleaved, all
#     resident and 16 of 32 layers spilled.
#   call.sh serve: llama-server built (FA on) while the same GPU tests run; then hipfire serve
#     and llama-server under the same load (the serve record's run.sh), nothing else running;
#     then the bench A/B at 16 spilled while time is left.
# It reads what the call carried in an untracked dev-lead/ folder: bundle.txz (bin/hipfire,
# MANIFEST and GPU test executables from `scripts/device-check.sh build`), llama.cpp-src.tar.gz
# (the llama-cpp-python 0.3.36 sdist's vendored source), hipfire-base.xz (cb597eb's binary) and
# gemv_gbs.txz (hipfire-quant's gemv_gbs example, built with and without the tiled Q4_K kernel).
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
  for t in "hipfire-gpu--gpu_gemv multi_column prepare_cols" "hipfire-model--gpu_attention" \
           "hipfire-model--gpu_batch_decode" "hipfire-model--gpu_synth" "hipfire-model--gpu_prefill"; do
    set -- $t; n=$1; shift
    echo "== $n $* ($(el) s)"
    timeout 150 $B/tests/$n --test-threads 1 "$@" 2>&1 |
      grep -E "^test |panicked|assert|left|right|FAILED|test result|error" | head -60
  done
  echo "tests done $(el) s"
}
# Engine time alone: B sequences stepped by batched decode, old and new interleaved, per budget.
bench() {
  local R=$OUT/bench.jsonl; touch $R
  for b in "$@"; do
    m=passback; [[ $b == 32 ]] && m=pcie
    for bin in /root/hipfire-base $B/bin/hipfire; do
      tag=new; [[ $bin == /root/hipfire-base ]] && tag=base
      timeout 90 $bin bench $L8B --device gpu --gpu-layer-budget $b --offload-exec $m -p 0 -n 32 -r 2 \
        --batch 1,4,8,16 --json 2>>$OUT/bench.log | python3 -c "
import sys, json
for r in json.load(sys.stdin):
    print(json.dumps({'bin': '$tag', 'budget': $b, 'test': r['test'], 'ts': r['avg_ts']}))" >> $R
      echo "bench $tag $b done $(el) s" >> $OUT/bench.log
    done
  done
}
# The CPU multi-column Q4_K kernels on this box's 16 threads, DRAM-fed: gg_rows never takes the
# tiled kernel, gg_tiled takes it from 2 columns (gemv_gbs.txz: the same example built twice).
sweep() {
  mkdir -p /root/gg && tar xJf dev-lead/gemv_gbs.txz -C /root/gg
  for k in 4096 14336; do
    for c in 2 3 4 5 6 8 12 16; do
      for g in rows tiled; do
        echo "k $k cols $c $g $(/root/gg/gg_$g --formats q4_k --k $k --m 4096 --threads 16 --cols $c \
          --footprint-mib 256 --reps 3 | tail -1)"
      done
    done
  done
}
if [[ $PART == check ]]; then
  tests > $OUT/tests.log 2>&1
  bench 32 16
  sweep > $OUT/sweep.log 2>&1
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
wait $BPID; echo "llama build rc $? at $(el) s" >> $OUT/synth.log
tail -2 /root/llama-build.log >> $OUT/synth.log
COMMIT=$(head -1 $B/MANIFEST) bash docs/perf-checkpoints/2026-12-01-serve-gpu-h200/run.sh \
  $B/bin/hipfire $src/build/bin/llama-server $L8B ${SECS:-15}
echo "serve done $(el) s" >> $OUT/serve-env.txt
(( $(el) < 480 )) && bench 16
echo "done $(el) s" >> $OUT/serve-env.txt
