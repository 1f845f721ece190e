#!/usr/bin/env bash
# Device call: CPU prefill at 16 threads vs llama.cpp on the CPU, decode before/after (the final
# tree against cc708fe), offload-bench of the formats, and `run --json` time to first token.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
W=/root/w; rm -rf $W; mkdir -p $W
tar xJf dev-lead/bundle.txz -C $W
B=$W/device-bundle
OLD=/root/hipfire-old; xz -dc dev-lead/hipfire-old.xz > $OLD && chmod +x $OLD
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p /root/lb && cat .llamacpp/llama-fa-bin.tar.xz.part* | tar xJf - -C /root/lb
LB=/root/lb/llama-bench
L8B=/root/l8b.gguf
[[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /tmp/synth.log 2>&1
lscpu | grep -iE "model name|flags" | grep -oE "Model name.*|amx[a-z_0-9]*|avx512_vnni" | sort -u | tr '\n' ' ' > $OUT/cpu.txt; echo >> $OUT/cpu.txt
# CPU prefill, 16 threads, interleaved: hipfire (CPU path) vs llama.cpp with the GPU hidden.
: > $OUT/cpu-prefill.jsonl
for round in 1 2; do
  timeout 120 $B/bin/hipfire bench $L8B --device cpu --threads 16 -p 512 -n 0 -r 2 --json 2>>/tmp/cpu.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'hipfire','round':$round,'test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r['samples_ts']}))" >> $OUT/cpu-prefill.jsonl
  CUDA_VISIBLE_DEVICES= timeout 150 $LB -m $L8B -p 512 -n 0 -t 16 -r 2 -o json 2>>/tmp/cpu.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'llama.cpp','round':$round,'test':'pp512','avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts'),'backends':r.get('backends'),'n_gpu_layers':r.get('n_gpu_layers')}))" >> $OUT/cpu-prefill.jsonl
  echo "cpu round $round $(( $(date +%s) - T0 )) s"
done
cat $OUT/cpu-prefill.jsonl | cut -c1-160
# Decode before/after, interleaved.
: > $OUT/decode-ab.jsonl
for round in 1 2; do
  for b in 32 16; do
    m=passback; [[ $b == 32 ]] && m=pcie
    timeout 100 $OLD bench $L8B --device gpu --gpu-layer-budget $b --offload-exec $m --prompt-tokens 16 --gen-tokens 64 --rounds 1 --json 2>>/tmp/ab.err | python3 -c "import sys,json; d=json.load(sys.stdin); print(json.dumps({'bin':'old','budget':$b,'round':$round,'tg':d['modes'][0]['decode_tok_s']['median']}))" >> $OUT/decode-ab.jsonl
    timeout 100 $B/bin/hipfire bench $L8B --device gpu --gpu-layer-budget $b --offload-exec $m -p 0 -n 64 -r 1 --json 2>>/tmp/ab.err | python3 -c "import sys,json; d=json.load(sys.stdin); r=[x for x in d if x['test'].startswith('tg')][0]; print(json.dumps({'bin':'new','budget':$b,'round':$round,'tg':r['avg_ts']}))" >> $OUT/decode-ab.jsonl
  done
done
cat $OUT/decode-ab.jsonl
echo "ab done $(( $(date +%s) - T0 )) s"
timeout 150 $B/bin/hipfire offload-bench --format q4_k,q5_0,q5_1,q5_k,q3_k,q2_k,iq4_nl,iq4_xs --json > $OUT/offload-bench.json 2>/tmp/ob.err; echo "offload-bench exit $?"
python3 -c "
import json; d=json.load(open('$OUT/offload-bench.json')); print(json.dumps(d)[:1500])" 2>&1 | head -20
# Time to first token on the GPU, a ~2000-token prompt.
P=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the quiet river bank.']*150))")
for ub in 1024 1; do
  timeout 120 $B/bin/hipfire run $L8B "$P" --device gpu --gpu-layer-budget 16 --ubatch-size $ub -n 8 --json 2>>/tmp/run.err | python3 -c "
import sys,json; d=json.load(sys.stdin); print(json.dumps({'ubatch':$ub, **{k:d.get(k) for k in ('prompt_tokens','ttft_ms','prefill_tok_per_s','decode_tok_per_s','generated','placement')}}))" | tee -a $OUT/run-ttft.jsonl
done
tar czf $OUT/logs.tgz /tmp/cpu.err /tmp/ab.err /tmp/ob.err /tmp/run.err 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 )) s"
