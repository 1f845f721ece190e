#!/usr/bin/env bash
# Aggregate decode of `hipfire serve` (batched GPU decode over sequence slots, 16 of 32 layers
# spilled, passback) against llama.cpp's `llama-server` with the same 16 layers on its CPU
# (-ngl 16, FlashAttention on), same synthetic Llama-3-8B Q4_K GGUF, on the H200 box; one server
# up at a time; 1/4/8/16 concurrent streaming clients (scripts/serve_load.py), each request
# greedy, 64 tokens, end-of-generation ignored, 1024 positions per slot, 16 slots.
# Usage (on the box): run.sh HIPFIRE_BIN LLAMA_SERVER MODEL [SECONDS]
set -uo pipefail
BIN="$1"; LS="$2"; MODEL="$3"; SECS="${4:-20}"
: "${OUT:?writes under \$OUT}"
wait_up() { for _ in $(seq 900); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; echo "port $1 never came up" >&2; return 1; }
stop() { kill -TERM "$1" 2>/dev/null; for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done; kill -KILL "$1"; }
load() { python3 scripts/serve_load.py --url "http://127.0.0.1:$1" --concurrency "$2" --seconds "$SECS" \
           --max-tokens 64 --label "$3" | tee -a "$OUT/serve-raw.jsonl"; echo; }
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: ${COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
} > "$OUT/serve-env.txt"
HIPFIRE_HOME=$(mktemp -d) "$BIN" serve "$MODEL" --device gpu --gpu-layer-budget 16 --offload-exec passback \
  --parallel 16 --ctx-size 1024 --port 18190 >/dev/null 2>>"$OUT/serve-hipfire.log" &
P=$!; wait_up 18190 && for c in 1 4 8 16; do load 18190 "$c" "hipfire c$c"; done
curl -s http://127.0.0.1:18190/metrics > "$OUT/serve-hipfire-metrics.txt"
stop "$P"
"$LS" -m "$MODEL" -ngl 16 -fa on -t 16 -np 16 -c 16384 --host 127.0.0.1 --port 18192 \
  >/dev/null 2>>"$OUT/serve-llama.log" &
P=$!; wait_up 18192 && for c in 1 4 8 16; do load 18192 "$c" "llama-server c$c"; done
stop "$P"
