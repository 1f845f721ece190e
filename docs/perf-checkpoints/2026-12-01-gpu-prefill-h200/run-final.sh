#!/usr/bin/env bash
# Device call: the GPU tier of the final tree (prefill, Gemma 3 on the GPU, decode in every mode),
# then prefill vs llama.cpp with the default micro-batch.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
W=/root/w; rm -rf $W; mkdir -p $W
tar xJf dev-lead/bundle.txz -C $W
B=$W/device-bundle
export HIPFIRE_GPU_TESTS=1 HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p /root/lb && cat .llamacpp/llama-fa-bin.tar.xz.part* | tar xJf - -C /root/lb
LB=/root/lb/llama-bench
L8B=/root/l8b.gguf
[[ -f $L8B ]] || ( $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /tmp/synth.log 2>&1 ) &
SYNTH=$!
run_t() { # exe filter timeout
  echo "== $1 $2 $(date +%T)"
  timeout $3 $B/tests/$1 --test-threads 1 --nocapture $2 > /tmp/t.log 2>&1; echo "exit $?"
  grep -E "^test .*(ok|FAILED)$|test result|panicked|over the bound|differ from|gemma|chunk attention" /tmp/t.log | cut -c1-220 | head -70
}
{
cat $B/MANIFEST
run_t hipfire-model--hipfire_model gpu_batch 60
run_t hipfire-model--gemma_gpu_kernels "" 60
run_t hipfire-model--gpu_attention "" 90
run_t hipfire-model--gpu_prefill "" 200
run_t hipfire-model--gpu_synth "" 200
run_t hipfire-exec--gpu_offload "" 120
run_t hipfire-gpu--gpu_gemm "" 60
} > $OUT/tests.log 2>&1
grep -E "^== |^exit|test result|FAILED|panicked" $OUT/tests.log
echo "tests done $(( $(date +%s) - T0 )) s"
wait $SYNTH 2>/dev/null
python3 - > $OUT/h2d.txt 2>&1 <<'PY'
import torch, time
x = torch.empty(1 << 30, dtype=torch.uint8).pin_memory(); y = torch.empty_like(x, device='cuda')
for _ in range(2): y.copy_(x, non_blocking=True)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(5): y.copy_(x, non_blocking=True)
torch.cuda.synchronize(); dt = time.perf_counter() - t
print(f"pinned H2D {5 * (1 << 30) / dt / 1e9:.1f} GB/s")
PY
cat $OUT/h2d.txt
R=$OUT/hipfire-pp.jsonl; : > $R
hb() { # label args...
  local label=$1; shift
  timeout 150 $B/bin/hipfire bench $L8B --device gpu "$@" --json 2>>/tmp/bench.err | python3 -c "
import sys,json; rows=json.load(sys.stdin)
for r in rows: r['label']='$label'; print(json.dumps(r))
" >> $R || echo "{\"label\":\"$label\",\"error\":true}" >> $R
  grep "\"label\": \"$label\"" $R | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l)
  print(d['label'], d.get('test'), round(d.get('avg_ts',0),1), '+-', round(d.get('stddev_ts',0),1)) if not d.get('error') else print(d['label'],'ERROR')"
}
for b in 32 24 16 8; do
  m=passback; [[ $b == 32 ]] && m=pcie
  hb b$b --gpu-layer-budget $b --offload-exec $m -p 512,2048 -n 0 -r 3
done
hb b32-small --gpu-layer-budget 32 --offload-exec pcie -p 3,4,8 -n 0 -r 3
echo "hipfire done $(( $(date +%s) - T0 )) s"
for n in 99 24 16 8; do
  fa=0,1; [[ $n != 99 && $n != 16 ]] && fa=0
  timeout 200 $LB -m $L8B -p 512,2048 -n 0 -fa $fa -ngl $n -ot "output=CUDA0" -r 2 -t 16 -o json > /tmp/llama-pp-ngl$n.json 2>>/tmp/llama.err
done
python3 -c "
import json,glob
rows=[]
for f in sorted(glob.glob('/tmp/llama-pp-ngl*.json')):
  try: rows += json.load(open(f))
  except Exception as e: print(f, 'unreadable', e)
json.dump(rows, open('$OUT/llama-pp.json','w'), indent=1)
for r in rows: print('llama ngl',r['n_gpu_layers'],'fa',r['flash_attn'],'pp',r['n_prompt'],round(r['avg_ts'],1))"
tar czf $OUT/logs.tgz /tmp/bench.err /tmp/llama.err 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 )) s"
