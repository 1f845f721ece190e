#!/usr/bin/env bash
# The record's run: aggregate decode tok/s at 1 and 4 concurrent streams of `hipfire serve`
# (--parallel 4) and of llama-cpp-python's OpenAI server (the issue's fallback when
# llama-server cannot be built; it runs one request at a time), same GGUF, 2 threads each,
# rounds interleaved; then 16 streams on a --parallel 16 hipfire server.
# Usage: docs/perf-checkpoints/2026-12-01-serve-cpu-2core/run.sh MODEL.gguf [ROUNDS] [SECONDS]
# Needs target/release/hipfire and pip install 'llama-cpp-python[server]'.
set -euo pipefail
cd "$(dirname "$0")/../../.."
MODEL="$1"; ROUNDS="${2:-2}"; SECS="${3:-20}"
OUT="docs/perf-checkpoints/2026-12-01-serve-cpu-2core"
BIN=target/release/hipfire
wait_up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return; sleep 0.2; done; echo "port $1 never came up" >&2; exit 1; }
stop() { kill -TERM "$1"; while kill -0 "$1" 2>/dev/null; do sleep 0.2; done; }
load() { python3 scripts/serve_load.py --url "http://127.0.0.1:$1" --concurrency "$2" --seconds "$SECS" \
           --max-tokens 64 --ban-tokens 0,2 --label "$3" | tee -a "$OUT/raw.jsonl"; echo; }
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  echo "llama-cpp-python: $(python3 -c 'import llama_cpp; print(llama_cpp.__version__)')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env.txt"
: > "$OUT/raw.jsonl"
"$BIN" serve "$MODEL" --port 18090 --ctx-size 1024 --threads 2 --parallel 4 >/dev/null 2>>"$OUT/server.log" &
HF=$!
# --interrupt_requests False: by default a new request cuts off the one running (so under
# concurrency its streams end after a token or two); off, it queues them and runs one at a time.
python3 -m llama_cpp.server --model "$MODEL" --n_threads 2 --n_ctx 1024 --host 127.0.0.1 --port 18092 \
  --interrupt_requests False \
  >/dev/null 2>"$OUT/llama-cpp-python.log" &
LC=$!
wait_up 18090; wait_up 18092
for r in $(seq "$ROUNDS"); do
  for c in 1 4; do
    load 18090 "$c" "hipfire p4 c$c round $r"
    load 18092 "$c" "llama-cpp-python c$c round $r"
  done
done
curl -s http://127.0.0.1:18090/metrics > "$OUT/metrics-p4.txt"
stop "$HF"; stop "$LC"
"$BIN" serve "$MODEL" --port 18091 --ctx-size 1024 --threads 2 --parallel 16 >/dev/null 2>>"$OUT/server.log" &
HF=$!
wait_up 18091
load 18091 16 "hipfire p16 c16"
curl -s http://127.0.0.1:18091/metrics > "$OUT/metrics-p16.txt"
stop "$HF"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
