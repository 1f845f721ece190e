#!/usr/bin/env bash
# The 2-core dev VM (no AMX: the AVX-512 VNNI row dots): this tree against a baseline binary,
# interleaved rounds, CPU prefill (pp200) and decode (tg32) of the synthetic Llama-3-8B Q4_K and
# SmolLM2-135M Q4_1. Usage: ab-2core.sh L8B.gguf BASELINE_HIPFIRE [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../../.."
L8B="$1"; BASE="$2"; ROUNDS="${3:-3}"
OUT=docs/perf-checkpoints/2026-12-03-cpu-prefill-claims-h200/raw-2core
SMOL=$(scripts/smollm2-path.sh | tail -1)
{ echo "commit: $(git rev-parse --short HEAD)"; echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  echo "baseline: $BASE"; } > $OUT/env.txt
: > $OUT/ab.jsonl
run() { # label binary model tests
  "$2" bench "$3" --device cpu --threads 2 $4 -r 2 --json 2>>$OUT/bench.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'label':'$1','round':$r,'model':'$5','test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts'),'load':open('/proc/loadavg').read().split()[0]}))" | tee -a $OUT/ab.jsonl | cut -c1-140
}
for r in $(seq $ROUNDS); do
  run new target/release/hipfire "$L8B" "-p 200 -n 0" l8b
  run base "$BASE" "$L8B" "-p 200 -n 0" l8b
  run new target/release/hipfire "$SMOL" "-p 200 -n 32" smollm2
  run base "$BASE" "$SMOL" "-p 200 -n 32" smollm2
done
