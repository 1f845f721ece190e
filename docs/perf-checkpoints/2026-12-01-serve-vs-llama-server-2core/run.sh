#!/usr/bin/env bash
# Aggregate decode tok/s of `hipfire serve --parallel 4` against llama.cpp's `llama-server -np 4`
# (built on this box from the llama-cpp-python 0.3.36 sdist's vendored source, CPU only), same
# SmolLM2 GGUF, 2 threads each, 1024 positions per slot, 64 tokens per request with EOG banned;
# one server up at a time, rounds interleaved.
# Usage: run.sh MODEL.gguf LLAMA_SERVER [ROUNDS] [SECONDS]   (needs target/release/hipfire)
set -euo pipefail
cd "$(dirname "$0")/../../.."
MODEL="$1"; LS="$2"; ROUNDS="${3:-2}"; SECS="${4:-20}"
OUT="docs/perf-checkpoints/2026-12-01-serve-vs-llama-server-2core"
BIN=target/release/hipfire
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return; sleep 0.2; done; echo "port $1 never came up" >&2; exit 1; }
stop() { kill -TERM "$1"; while kill -0 "$1" 2>/dev/null; do sleep 0.2; done; }
load() { python3 scripts/serve_load.py --url "http://127.0.0.1:$1" --concurrency "$2" --seconds "$SECS" \
           --max-tokens 64 --ban-tokens 0,2 --label "$3" | tee -a "$OUT/raw.jsonl"; echo; }
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  echo "llama-server: $("$LS" --version 2>&1 | tr '\n' ' ')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env.txt"
: > "$OUT/raw.jsonl"
for r in $(seq "$ROUNDS"); do
  HIPFIRE_HOME=$(mktemp -d) "$BIN" serve "$MODEL" --port 18190 --ctx-size 1024 --threads 2 --parallel 4 \
    >/dev/null 2>>"$OUT/hipfire.log" &
  P=$!; wait_up 18190
  for c in 1 4; do load 18190 "$c" "hipfire p4 c$c round $r"; done
  stop "$P"
  "$LS" -m "$MODEL" -t 2 -np 4 -c 4096 --host 127.0.0.1 --port 18192 >/dev/null 2>>"$OUT/llama-server.log" &
  P=$!; wait_up 18192
  for c in 1 4; do load 18192 "$c" "llama-server np4 c$c round $r"; done
  stop "$P"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
