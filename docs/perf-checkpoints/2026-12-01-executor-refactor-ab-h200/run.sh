#!/usr/bin/env bash
# Device call: GPU tier of the executor refactor (offload joins, synth decode in every mode), then
# the interleaved before/after decode A/B (cc708fe vs the merged tree) and single_layer chain 8.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
W=/root/ab; rm -rf $W; mkdir -p $W
tar xJf dev-lead/ab.txz -C $W
export HIPFIRE_GPU_TESTS=1 HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
L8B=/root/l8b.gguf
[[ -f $L8B ]] || ( $W/new/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /tmp/synth.log 2>&1 ) &
SYNTH=$!
run_t() { # exe filter timeout
  echo "== $1 $2 $(date +%T)"
  timeout $3 $W/new/tests/$1 --test-threads 1 --nocapture $2 2>&1 | grep -E "^test |test result|panicked|FAILED|over the bound|max \|" | head -80
}
{
cat $W/new/MANIFEST
run_t hipfire-exec--gpu_offload "" 120
run_t hipfire-model--gpu_synth "" 200
run_t hipfire-gpu--gpu_faults "" 60
} > $OUT/tests.log 2>&1
grep -E "^== |test result|FAILED|panicked" $OUT/tests.log
echo "tests done $(( $(date +%s) - T0 )) s"
wait $SYNTH 2>/dev/null
R=$OUT/ab.jsonl; : > $R
old() { # budget mode round
  timeout 100 $W/old/hipfire bench $L8B --device gpu --gpu-layer-budget $1 --offload-exec $2 --prompt-tokens 16 --gen-tokens 64 --rounds 1 --json 2>>/tmp/ab.err |
    python3 -c "import sys,json; d=json.load(sys.stdin); print(json.dumps({'bin':'old','budget':$1,'round':$3,'tg':d['modes'][0]['decode_tok_s']['median']}))" >> $R || echo "{\"bin\":\"old\",\"budget\":$1,\"error\":true}" >> $R
}
new() {
  timeout 100 $W/new/hipfire bench $L8B --device gpu --gpu-layer-budget $1 --offload-exec $2 -p 0 -n 64 -r 1 --json 2>>/tmp/ab.err |
    python3 -c "import sys,json; d=json.load(sys.stdin); r=[x for x in d if x['test'].startswith('tg')][0]; print(json.dumps({'bin':'new','budget':$1,'round':$3,'tg':r['avg_ts']}))" >> $R || echo "{\"bin\":\"new\",\"budget\":$1,\"error\":true}" >> $R
}
for round in 1 2 3; do
  for b in 32 24 16 8; do
    m=passback; [[ $b == 32 ]] && m=pcie
    if (( round % 2 )); then old $b $m $round; new $b $m $round; else new $b $m $round; old $b $m $round; fi
  done
  echo "round $round $(( $(date +%s) - T0 )) s"
done
python3 - <<PY
import json, statistics as st
rows=[json.loads(l) for l in open("$R")]
for b in (32,24,16,8):
    o=[r['tg'] for r in rows if r.get('budget')==b and r['bin']=='old' and 'tg' in r]
    n=[r['tg'] for r in rows if r.get('budget')==b and r['bin']=='new' and 'tg' in r]
    if o and n: print(f"budget {b}: old {st.median(o):.1f} {o} new {st.median(n):.1f} {n} ratio {st.median(n)/st.median(o):.3f}")
    else: print(f"budget {b}: missing", o, n)
PY
for bin in old new old new; do
  timeout 90 $W/$bin/single_layer --chain 8 --reps 20 --target-rounds 3 > /tmp/sl-$bin.txt 2>&1
  echo "single_layer $bin:"; grep -iE "flags|auto|ceiling|median|ms" /tmp/sl-$bin.txt | tail -6
  cat /tmp/sl-$bin.txt >> $OUT/single_layer-$bin.txt
done
echo "elapsed $(( $(date +%s) - T0 )) s"
