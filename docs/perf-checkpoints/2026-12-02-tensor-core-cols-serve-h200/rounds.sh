#!/usr/bin/env bash
# The follow-up call on the warm box right after call-serve.sh: hipfire serve of this change (new)
# and of f6661a0 (base) at 8 and 1 streams, alternated, two more rounds each (the first round is in
# call-serve.sh, where the new build ran right after the llama-server build and base last).
set -uo pipefail
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib
L8B=/root/l8b.gguf; B=/root/d2
wait_up() { for _ in $(seq 900); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
stop() { kill -TERM "$1" 2>/dev/null; for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done; kill -KILL "$1"; }
load() { python3 scripts/serve_load.py --url "http://127.0.0.1:$1" --concurrency "$2" --seconds 15 --max-tokens 64 --label "$3" >> "$OUT/serve-rounds.jsonl"; }
hf() { local bin=$1 tag=$2 port=$3; shift 3
  HIPFIRE_HOME=$(mktemp -d) "$bin" serve "$L8B" --device gpu --gpu-layer-budget 16 --offload-exec passback --parallel 16 --ctx-size 1024 --port $port >/dev/null 2>>"$OUT/serve-rounds.log" &
  local P=$!; wait_up $port && for c in "$@"; do load $port "$c" "$tag c$c"; done; stop "$P"; }
hf $B/bin/hipfire new-r2 18200 8 1
hf /root/hipfire-base base-r2 18202 8 1
hf $B/bin/hipfire new-r3 18204 1 8
hf /root/hipfire-base base-r3 18206 1 8
