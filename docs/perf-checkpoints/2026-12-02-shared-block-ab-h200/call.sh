#!/usr/bin/env bash
# Device call (run from the repository root on the H200 box):
#  1. GPU tier of the shared block (GPU decode vs the CPU path in every mode and join, batched
#     prefill, batched decode, graphs, q8_0 cache, Gemma kernels), while llama-bench (CPU-only,
#     AMX) builds and the synthetic Llama-3-8B Q4_K is written;
#  2. quiet: the interleaved before/after A/B — c00fb4e (two block definitions) against the
#     shared block — pp512 and tg64 at 32 / 24 / 16 / 8 of 32 layers resident, passback flags;
#  3. quiet: CPU prefill pp512 at 16 threads, hipfire (512-token AMX chunks) and llama-bench.
# Carried in dev-lead/: bundle2.tgz (bin/, tests/, MANIFEST) and llama.cpp-src.tar.gz.
set -uo pipefail
: "${OUT:?}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d2; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle2.tgz -C $B
cat $B/MANIFEST > $OUT/env.txt
L8B=/root/l8b.gguf; src=/root/llama.cpp; LB=$src/build/bin/llama-bench
( [[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /root/synth.log 2>&1 ) &
SP=$!
( [[ -x $LB ]] || { tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S $src -B $src/build -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_BUILD_TYPE=Release > /root/llama-cmake.log 2>&1 &&
  timeout 240 cmake --build $src/build --target llama-bench -j 16 > /root/llama-build.log 2>&1; } ) &
BP=$!
{
  for spec in "150 gpu_synth" "120 gpu_batch_decode" "60 gpu_prefill" "40 gpu_decode_graphs" \
              "60 gpu_kv_q8" "60 gemma_gpu_kernels" "60 lib gpu::"; do
    set -- $spec; lim=$1; n=$2; shift 2
    (( $(el) < 260 )) || { echo "== $n skipped (time)"; continue; }
    echo "== $n $* ($(el) s)"
    timeout $lim $B/tests/$n --test-threads 1 "$@" 2>&1 | grep -E "^test |panicked|FAILED|test result|skipped|left|right|over" | head -80
  done
  echo "tests done $(el) s"
} > $OUT/tests.log 2>&1
wait $BP; echo "llama-bench build rc $? at $(el) s" >> $OUT/tests.log
wait $SP; tail -1 /root/synth.log >> $OUT/tests.log
grep -E "^== |test result|FAILED|panicked|done|rc" $OUT/tests.log
# 2. A/B, fresh process each, order alternating per round.
R=$OUT/ab.jsonl; : > $R
one() { # bin budget mode round
  timeout 100 $B/bin/$1 bench $L8B --device gpu --gpu-layer-budget $2 --offload-exec $3 -p 512 -n 64 -r 1 --json 2>>$OUT/ab.err |
    python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'bin':'$1','budget':$2,'round':$4,'test':r['test'],'ts':r['avg_ts']}))" >> $R ||
    echo "{\"bin\":\"$1\",\"budget\":$2,\"round\":$4,\"error\":true}" >> $R
}
for round in 1 2 3; do
  (( $(el) < 430 )) || break
  for b in 32 24 16 8; do
    m=passback; [[ $b == 32 ]] && m=pcie
    if (( round % 2 )); then one hipfire-base $b $m $round; one hipfire $b $m $round
    else one hipfire $b $m $round; one hipfire-base $b $m $round; fi
  done
  echo "ab round $round at $(el) s"
done
python3 - <<PY
import json, statistics as st
rows=[json.loads(l) for l in open("$R")]
for t in ("pp512","tg64"):
  for b in (32,24,16,8):
    o=[r['ts'] for r in rows if r.get('budget')==b and r['bin']=='hipfire-base' and r.get('test')==t]
    n=[r['ts'] for r in rows if r.get('budget')==b and r['bin']=='hipfire' and r.get('test')==t]
    if o and n: print(f"{t} budget {b}: before {st.median(o):.1f} {[round(x,1) for x in o]} after {st.median(n):.1f} {[round(x,1) for x in n]} ratio {st.median(n)/st.median(o):.3f}")
    else: print(f"{t} budget {b}: missing", o, n)
PY
# 3. CPU prefill at 16 threads.
: > $OUT/cpu-prefill.jsonl
hb() { timeout 100 $B/bin/hipfire bench $L8B --device cpu --threads 16 -p 512 -n 0 -r 2 --json 2>>$OUT/cpu-prefill.err |
  python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'hipfire','round':$1,'test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts')}))" >> $OUT/cpu-prefill.jsonl; }
lb() { timeout 100 $LB -m $L8B -p 512 -n 0 -t 16 -r 2 -o json 2>>$OUT/cpu-prefill.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'llama.cpp','round':$1,'test':'pp512','avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts')}))" >> $OUT/cpu-prefill.jsonl; }
for round in 1 2; do
  (( $(el) < 500 )) || break
  if (( round % 2 )); then hb $round; lb $round; else lb $round; hb $round; fi
done
echo "done $(el) s"; cut -c1-200 $OUT/cpu-prefill.jsonl
