#!/usr/bin/env bash
# Device call: `hipfire run --json` time to first token on a ~2000-token prompt, batched vs token
# by token.
set -uo pipefail
: "${OUT:?}"
W=/root/w; rm -rf $W; mkdir -p $W
tar xJf dev-lead/bundle.txz -C $W
B=$W/device-bundle
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
L8B=/root/l8b.gguf
[[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /tmp/synth.log 2>&1
P=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the quiet river bank.']*28))")
for cfg in "32 1024" "32 1" "16 1024" "8 1024"; do
  set -- $cfg
  timeout 120 $B/bin/hipfire run $L8B "$P" --device gpu --gpu-layer-budget $1 --ubatch-size $2 -n 8 --json 2>>$OUT/run.err | python3 -c "
import sys,json; d=json.load(sys.stdin); print(json.dumps({'budget':$1,'ubatch':$2, **{k:d.get(k) for k in ('prompt_tokens','ttft_ms','prefill_tok_per_s','decode_tok_per_s','generated','placement')}}))" | tee -a $OUT/run-ttft.jsonl
done
