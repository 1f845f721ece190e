#!/usr/bin/env bash
# Device call (run from the repository root on the H200 box):
#  1. the GPU tests of the prefill paths (gpu_prefill: short runs through the multi-column GEMV
#     among them) and of batched decode, while the synthetic Llama-3-8B Q4_K is written;
#  2. short prompts: `bench --device gpu -p 2,4,8,16,32 -n 32 -r 3` of this tree (`hipfire`)
#     and of the tree before it (`hipfire-prev`), all resident and with 16 of 32 layers
#     spilled (passback), two interleaved rounds.
# Carried: device-bundle/bundle.tgz (bin/, tests/).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xzf device-bundle/bundle.tgz -C $B
cat $B/MANIFEST > $OUT/env.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $OUT/env.txt
L8B=/root/l8b.gguf
( [[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /root/synth.log 2>&1 ) &
SP=$!
export HIPFIRE_GPU_TESTS=1
{ echo "== gpu_prefill"; timeout 150 $B/tests/gpu_prefill --test-threads 1 --nocapture short_runs batched_prefill_matches_token_by_token streamed 2>&1
  echo "== gpu_batch_decode"; timeout 90 $B/tests/gpu_batch_decode --test-threads 1 --nocapture 2>&1; } |
  grep -E "^== |test |test result|short runs|panicked|FAILED|over the bound" > $OUT/tests.log 2>&1
echo "tests done $(el) s" > $OUT/log.txt
wait $SP; echo "synth at $(el) s" >> $OUT/log.txt
: > $OUT/short.jsonl
hb() { # binary placement round args...
  local bin=$1 place=$2 round=$3; shift 3
  timeout 100 $B/bin/$bin bench $L8B --device gpu -p 2,4,8,16,32 -n 32 -r 3 "$@" --json 2>>$OUT/bench.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'$bin','placement':'$place','round':$round,'test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts')}))" >> $OUT/short.jsonl
}
for round in 1 2; do
  (( $(el) < 200 )) || break
  hb hipfire resident $round; hb hipfire-prev resident $round
  hb hipfire spilled16 $round --gpu-layer-budget 16 --offload-exec passback
  hb hipfire-prev spilled16 $round --gpu-layer-budget 16 --offload-exec passback
  echo "round $round at $(el) s" >> $OUT/log.txt
done
echo "done $(el) s" >> $OUT/log.txt
cat $OUT/log.txt; cat $OUT/tests.log | tail -40; cut -c1-150 $OUT/short.jsonl; tail -5 $OUT/bench.err
