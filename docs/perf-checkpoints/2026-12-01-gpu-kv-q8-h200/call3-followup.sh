#!/usr/bin/env bash
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xJf dev-lead/bundle.txz -C $B
R=/root/raw; rm -rf $R; mkdir -p $R; cat $B/MANIFEST > $R/env.txt
L8B=/root/l8b.gguf
$B/bin/hipfire synth --arch llama3-8b --format q4_k --ctx-len 32768 --out $L8B > $R/synth.log 2>&1 &
SP=$!
{
nvcc -arch=sm_90 -cubin -Xptxas -v -I kernels kernels/decode.cu -o /tmp/d.cubin 2>&1 | grep -A1 "attention_split" | grep -E "Compiling|registers|spill" | paste - - | sed 's/ptxas info    ://g'
nvcc -arch=sm_90 -cubin -Xptxas -v -DHF_ATTN_UNROLL_Q8=4 -I kernels kernels/decode.cu -o /tmp/d4.cubin 2>&1 | grep -A1 "attention_split_q8" | grep -E "Compiling|spill" | paste - - | sed 's/ptxas info    ://g;s/^/U4 /'
} > $OUT/regs.log 2>&1
{
for v in "f16" "q8_0" "q8_0 --define HF_ATTN_UNROLL_Q8=4"; do
  echo "== attention_timing $v ($(el) s)"
  timeout 90 $B/bin/attention_timing --cache-type $v --depths 1024,4096,16384 --iters 320 --json "$R/attention-${v// /_}.jsonl" 2>&1 | grep -E "planned" || echo "rc $?"
done
} > $OUT/timing.log 2>&1
wait $SP
D=4096,16384
hf() { local out=$1; shift; timeout 120 "$@" --json > $R/$out.json 2> $R/$out.err; echo "$out rc $? at $(el) s"; }
{
hf resident-f16 $B/bin/hipfire bench $L8B --device gpu -p 0 -n 32 -d $D -r 3
hf resident-q8 $B/bin/hipfire bench $L8B --device gpu --cache-type q8_0 -p 0 -n 32 -d $D -r 3
} > $OUT/bench.log 2>&1
{
for t in gpu_kv_q8 gpu_attention gpu_prefill gpu_synth; do
  left=$(( 410 - $(el) )); (( left < 20 )) && { echo "== $t skipped (time)"; continue; }
  echo "== $t ($(el) s, up to $left s)"
  timeout $left $B/tests/hipfire-model--$t --test-threads 1 --nocapture > $R/test-$t.log 2>&1; echo "rc $?"
  grep -E "^test .*(ok|FAILED)$|panicked|test result|q8_vs|q8_0 (res|pcie|batched)" $R/test-$t.log | cut -c1-160
done
} > $OUT/tests.log 2>&1
tar czf $OUT/raw.tgz -C /root raw
