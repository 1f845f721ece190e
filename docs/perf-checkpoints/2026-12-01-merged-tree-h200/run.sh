#!/usr/bin/env bash
# One device call: the GPU tier of the merged tree, then decode against llama.cpp (FA off/on)
# on the synthetic Llama-3-8B Q4_K, and the before/after A/B of the binary.
set -uo pipefail
: "${OUT:?}"
ROOT=$PWD
W=/root/w; mkdir -p $W
tar xf dev-lead/bundle.tgz -C $W
B=$W/device-bundle
OLD=/root/hipfire-old; gunzip -c dev-lead/hipfire-old.gz > $OLD && chmod +x $OLD
cat $B/MANIFEST | tee $OUT/manifest.txt
export HIPFIRE_GPU_TESTS=1 HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The CLI test finds the binary at the path cargo baked in at build time.
mkdir -p /work/main/target/release && cp $B/bin/hipfire /work/main/target/release/hipfire
# llama-bench (FA kernels built in; -fa 0 / -fa 1)
mkdir -p /root/lb && cat .llamacpp/llama-fa-bin.tar.xz.part* | tar xJf - -C /root/lb
LB=/root/lb/llama-bench
L8B=/root/l8b.gguf
( $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1 ) &
SYNTH=$!
{
for t in $B/tests/*; do
  n=$(basename $t)
  case "$n" in
    *gpu_gemv*|*gpu_faults*|*gpu_offload*|*planner_gpu*|*gpu_synth*|*gpu_attention*|*reference_agrees*) ;;
    *hipfire-cli--cli) ;;
    *) continue ;;
  esac
  filter=""; [[ "$n" == *hipfire-cli--cli ]] && filter=a_failed_gpu_load_allocation
  echo "== $n $(date +%T)"
  timeout 200 $t --test-threads 1 --nocapture $filter 2>&1 | grep -E "^test |test result|panicked|FAILED|error|cannot allocate|over the bound|skipped" | head -60
done
} > $OUT/tests.log 2>&1
grep -E "^== |test result" $OUT/tests.log
wait $SYNTH; tail -2 $OUT/synth.log
R=$OUT/bench.jsonl; : > $R
hb() { # label bin args...
  local label=$1 bin=$2; shift 2
  timeout 150 $bin bench $L8B --device gpu "$@" --json 2>>$OUT/bench.err | python3 -c "import sys,json; d=json.load(sys.stdin); print(json.dumps({'label':'$label','res':d}))" >> $R || echo "{\"label\":\"$label\",\"error\":true}" >> $R
  tail -1 $R | cut -c1-300
}
# A/B before/after at 0 / 16 / 24 spilled (budget 32 / 16 / 8), passback flags, 16+64 tokens.
for b in 32 16 8; do
  m=passback; [[ $b == 32 ]] && m=pcie
  hb "old-b$b" $OLD --gpu-layer-budget $b --offload-exec $m --prompt-tokens 16 --gen-tokens 64 --rounds 1
  hb "new-b$b" $B/bin/hipfire --gpu-layer-budget $b --offload-exec $m --prompt-tokens 16 --gen-tokens 64 --rounds 1
done
# Depth, all resident.
for d in 1024 4096; do
  hb "new-d$d" $B/bin/hipfire --gpu-layer-budget 32 --prompt-tokens $d --gen-tokens 32 --rounds 1
done
$LB -m $L8B -p 0 -n 32 -d 16,1024,4096 -fa 0,1 -ngl 99 -ot "output=CUDA0" -r 2 -t 16 -o json > $OUT/llama-depth.json 2>>$OUT/llama.err
python3 -c "
import json; d=json.load(open('$OUT/llama-depth.json'))
for r in d: print('llama fa',r['flash_attn'],'depth',r.get('n_depth'),'tg',r['n_gen'],round(r['avg_ts'],1))"
# 24 resident (8 spilled) at depth 4096.
hb "new-b24-d4096" $B/bin/hipfire --gpu-layer-budget 24 --offload-exec passback --prompt-tokens 4096 --gen-tokens 32 --rounds 1
$LB -m $L8B -p 0 -n 32 -d 4096 -fa 1 -ngl 24 -ot "output=CUDA0" -r 1 -t 16 -o json > $OUT/llama-b24-d4096.json 2>>$OUT/llama.err
python3 -c "
import json; d=json.load(open('$OUT/llama-b24-d4096.json'))
for r in d: print('llama ngl24 fa',r['flash_attn'],'depth',r.get('n_depth'),round(r['avg_ts'],1))"
ls -la $OUT
