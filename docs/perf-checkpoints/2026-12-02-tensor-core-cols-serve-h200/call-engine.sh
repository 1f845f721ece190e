#!/usr/bin/env bash
# Tensor-core multi-column Q4_K GEMV: kernel bench, its GEMV test, engine A/B, batched-decode tests.
set -uo pipefail
: "${OUT:?}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle.tgz -C $B
cp dev-lead/bin/hipfire-base /root/hipfire-base; chmod +x /root/hipfire-base
L8B=/root/l8b.gguf
( $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1 ) &
SYN=$!
{
  cat $B/MANIFEST; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  for c in 1 2 4 8 16; do
    echo "== cols $c ($(el) s)"
    timeout 90 $B/bin/gpu_bench --formats q4_k --shapes 4096x4096,1024x4096,14336x4096,4096x14336 \
      --cols $c --config 4x2x1x1 --config 4x2x1x1:notc --host-configs 0 --reps 9 --json $OUT/kernel-c$c.json 2>&1 | tail -12
  done
} > $OUT/kernel.log 2>&1
{
  echo "== gpu_gemv multi-column ($(el) s)"
  timeout 200 $B/tests/hipfire-gpu--gpu_gemv --test-threads 1 --nocapture multi_column 2>&1 |
    grep -E "^test |panicked|FAILED|test result|cols=|tensor-core|q4_k.*column 0" | head -60
} > $OUT/tests.log 2>&1
wait $SYN
bench() {
  local R=$OUT/bench.jsonl; touch $R
  for round in 1 2; do
    for budget in 32 16; do
      for bin in /root/hipfire-base $B/bin/hipfire; do
        tag=new; [[ $bin == /root/hipfire-base ]] && tag=base
        timeout 120 $bin bench $L8B --device gpu --gpu-layer-budget $budget --offload-exec passback -p 0 -n 32 -r 2 \
          --batch 1,4,8,16 --json 2>>$OUT/bench.log | python3 -c "
import sys, json
for r in json.load(sys.stdin):
    print(json.dumps({'bin': '$tag', 'round': $round, 'budget': $budget, 'test': r['test'], 'ts': r['avg_ts'], 'sd': r.get('stddev_ts')}))" >> $R
        echo "bench $tag budget $budget round $round done $(el) s" >> $OUT/bench.log
      done
    done
  done
}
bench
{
  for t in "hipfire-model--gpu_batch_decode" "hipfire-model--gpu_decode_graphs"; do
    echo "== $t ($(el) s)"
    timeout 150 $B/tests/$t --test-threads 1 --nocapture 2>&1 |
      grep -E "^test |panicked|FAILED|test result|batched vs" | head -60
  done
  echo "done $(el) s"
} >> $OUT/tests.log 2>&1
grep -h "" $OUT/tests.log | tail -5
