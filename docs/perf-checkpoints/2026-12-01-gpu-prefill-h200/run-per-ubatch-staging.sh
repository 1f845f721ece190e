#!/usr/bin/env bash
# Device call: GPU tier of batched prefill, then prefill tok/s vs llama.cpp pp512 on the 8B.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
W=/root/w; mkdir -p $W
tar xJf dev-lead/bundle.txz -C $W
B=$W/device-bundle
cat $B/MANIFEST | tee $OUT/manifest.txt
export HIPFIRE_GPU_TESTS=1 HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ls /usr/local/cuda/targets/x86_64-linux/lib | grep -i cublas | head -3 > $OUT/cublas.txt
mkdir -p /root/lb && cat .llamacpp/llama-fa-bin.tar.xz.part* | tar xJf - -C /root/lb
LB=/root/lb/llama-bench
L8B=/root/l8b.gguf
( $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1 ) &
SYNTH=$!
run_t() { # exe filter timeout
  echo "== $1 $2 $(date +%T)"
  timeout $3 $B/tests/$1 --test-threads 1 --nocapture $2 2>&1 | grep -E "^test |test result|panicked|FAILED|error|over the bound|differ|max \||worst|skipped|GB/s|thread" | head -80
}
{
run_t hipfire-gpu--gpu_gemm "" 60
run_t hipfire-gpu--gpu_dequant "" 90
run_t hipfire-model--hipfire_model gpu_batch 60
run_t hipfire-model--gpu_prefill "" 200
} > $OUT/tests.log 2>&1
grep -E "^== |test result" $OUT/tests.log
wait $SYNTH; tail -1 $OUT/synth.log
R=$OUT/bench.jsonl; : > $R
hb() { # label args...
  local label=$1; shift
  timeout 120 $B/bin/hipfire bench $L8B --device gpu "$@" --json 2>>$OUT/bench.err | python3 -c "import sys,json; d=json.load(sys.stdin); print(json.dumps({'label':'$label','res':d}))" >> $R || echo "{\"label\":\"$label\",\"error\":true}" >> $R
  python3 -c "
import json,sys; l=open('$R').read().splitlines()[-1]; d=json.loads(l)
if d.get('error'): print(d['label'],'ERROR')
else:
  m=d['res']['modes'][0]; print(d['label'],'pp',round(m['prefill_tok_s']['median'],1),'tg',round(m['decode_tok_s']['median'],1), m['placement'][-90:])"
}
hb b32-ub512 --gpu-layer-budget 32 --offload-exec pcie --prompt-tokens 512 --gen-tokens 16 --rounds 2
hb b32-ub1 --gpu-layer-budget 32 --offload-exec pcie --prompt-tokens 512 --gen-tokens 16 --rounds 1 --ubatch-size 1
for b in 24 16 8; do
  hb b$b-ub512 --gpu-layer-budget $b --offload-exec passback --prompt-tokens 512 --gen-tokens 16 --rounds 2
done
hb b32-p2048 --gpu-layer-budget 32 --offload-exec pcie --prompt-tokens 2048 --gen-tokens 16 --rounds 2
echo "elapsed $(( $(date +%s) - T0 )) s"
$LB -m $L8B -p 512 -n 0 -fa 0,1 -ngl 99 -ot "output=CUDA0" -r 2 -t 16 -o json > $OUT/llama-pp.json 2>>$OUT/llama.err
for n in 24 16 8; do $LB -m $L8B -p 512 -n 0 -fa 0 -ngl $n -ot "output=CUDA0" -r 1 -t 16 -o json > $OUT/llama-pp-ngl$n.json 2>>$OUT/llama.err; done
python3 -c "
import json,glob
for f in sorted(glob.glob('$OUT/llama-pp*.json')):
  for r in json.load(open(f)): print(f.split('/')[-1],'fa',r['flash_attn'],'ngl',r['n_gpu_layers'],'pp',r['n_prompt'],round(r['avg_ts'],1))"
echo "elapsed $(( $(date +%s) - T0 )) s"
