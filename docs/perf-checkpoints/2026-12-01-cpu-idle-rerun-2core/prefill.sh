#!/usr/bin/env bash
# CPU prefill tok/s on 2 threads, hipfire against llama.cpp's llama-bench (built on this box from
# the llama-cpp-python 0.3.36 sdist's vendored source, CPU only), same GGUF, 200-token prompt,
# rounds interleaved (hipfire, llama.cpp). Usage: prefill.sh L8B.gguf SMOLLM2.gguf LLAMA_BENCH [ROUNDS]
#   L8B.gguf: `hipfire synth --arch llama3-8b --format q4_k --out L8B.gguf`
# Writes prefill.jsonl beside this script: {"engine", "model", "round", "load", "tok_s"}.
set -euo pipefail
cd "$(dirname "$0")"
L8B="$1"; SMOL="$2"; LB="$3"; ROUNDS="${4:-3}"
HF=../../../target/release/hipfire
: > prefill.jsonl
row() { python3 -c 'import json,sys; print(json.dumps({"engine":sys.argv[1],"model":sys.argv[2],"round":int(sys.argv[3]),"load":float(sys.argv[4]),"tok_s":float(sys.argv[5])}))' "$@" | tee -a prefill.jsonl; }
for r in $(seq "$ROUNDS"); do
  for m in "$L8B" "$SMOL"; do
    name=$(basename "$m")
    t=$("$HF" bench "$m" --device cpu --threads 2 -p 200 -n 0 -r 1 --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
    row hipfire "$name" "$r" "$(cut -d' ' -f1 /proc/loadavg)" "$t"
    t=$("$LB" -m "$m" -p 200 -n 0 -t 2 -r 1 -o json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
    row llama.cpp "$name" "$r" "$(cut -d' ' -f1 /proc/loadavg)" "$t"
  done
done
