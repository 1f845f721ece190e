#!/usr/bin/env bash
# The 2-core dev VM: CPU decode of this tree against a baseline binary, many short interleaved
# rounds (SmolLM2-135M Q4_1 tg64 after a 200-token prompt, and the synthetic Llama-3-8B Q4_K
# tg16), to separate a decode change from the shared box's noise.
# Usage: [MODELS="smollm2 l8b"] ab-decode-2core.sh L8B.gguf BASELINE_HIPFIRE [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../../.."
L8B="$1"; BASE="$2"; ROUNDS="${3:-8}"; MODELS=${MODELS:-"smollm2 l8b"}
OUT=docs/perf-checkpoints/2026-12-03-cpu-prefill-claims-h200/raw-2core
SMOL=$(scripts/smollm2-path.sh | tail -1)
echo "commit: $(git rev-parse --short HEAD); baseline: $BASE" > $OUT/env-decode.txt
: > $OUT/decode.jsonl
run() { # label binary model-label model args
  "$2" bench "$4" --device cpu --threads 2 $5 -r 3 --json 2>>$OUT/decode.err | python3 -c "
import sys,json
for r in json.load(sys.stdin):
  if r['test'].startswith('tg'): print(json.dumps({'label':'$1','round':$r,'model':'$3','test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts'),'load':open('/proc/loadavg').read().split()[0]}))" >> $OUT/decode.jsonl
}
for r in $(seq $ROUNDS); do
  if (( r % 2 )); then a=new; b=base; else a=base; b=new; fi
  for who in $a $b; do
    bin=target/release/hipfire; [[ $who == base ]] && bin=$BASE
    [[ $MODELS == *smollm2* ]] && run $who $bin smollm2 "$SMOL" "-p 200 -n 64"
    [[ $MODELS == *l8b* ]] && run $who $bin l8b "$L8B" "-p 16 -n 16"
  done
done
python3 - "$OUT/decode.jsonl" <<'PY'
import json, sys, statistics as st
rows = {}
for l in open(sys.argv[1]):
    d = json.loads(l); rows.setdefault((d['model'], d['label']), []).append(d['avg_ts'])
for m in sorted({k[0] for k in rows}):
    n, b = rows[(m, 'new')], rows[(m, 'base')]
    wins = sum(x > y for x, y in zip(n, b))
    print(f"{m}: new {' / '.join(f'{v:.1f}' for v in n)} (median {st.median(n):.1f}); base {' / '.join(f'{v:.1f}' for v in b)} (median {st.median(b):.1f}); ratio {st.median(n)/st.median(b):.3f}; new ahead in {wins} of {len(n)}")
PY
