#!/usr/bin/env bash
# Serve: hipfire (tensor-core multi-column GEMV) vs llama-server, same call; GPU tests during the llama build.
set -uo pipefail
: "${OUT:?}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d2; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle.tgz -C $B
cp dev-lead/bin/hipfire-base /root/hipfire-base; chmod +x /root/hipfire-base
L8B=/root/l8b.gguf
[[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > $OUT/synth.log 2>&1 &
SYN=$!
src=/root/llama.cpp
( rm -rf $src; tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DLLAMA_BUILD_SERVER=ON \
    -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >/root/llama-cmake.log 2>&1 &&
  cmake --build "$src/build" --target llama-server -j 14 >/root/llama-build.log 2>&1 ) &
BPID=$!
{
  cat $B/MANIFEST
  for t in "hipfire-model--gpu_batch_decode" "hipfire-model--gpu_prefill"; do
    echo "== $t ($(el) s)"
    timeout 200 $B/tests/$t --test-threads 1 --nocapture 2>&1 |
      grep -E "^test |panicked|FAILED|test result|over the bound|batched vs" | cut -c1-200 | head -60
  done
} > $OUT/tests.log 2>&1
wait $SYN
wait $BPID; echo "llama build rc $? at $(el) s" >> $OUT/synth.log; tail -2 /root/llama-build.log >> $OUT/synth.log
LS=$src/build/bin/llama-server
wait_up() { for _ in $(seq 900); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; echo "port $1 never came up" >&2; return 1; }
stop() { kill -TERM "$1" 2>/dev/null; for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done; kill -KILL "$1"; }
load() { python3 scripts/serve_load.py --url "http://127.0.0.1:$1" --concurrency "$2" --seconds 15 \
           --max-tokens 64 --label "$3" | tee -a "$OUT/serve-raw.jsonl"; echo; }
hf() { # bin tag port levels...
  local bin=$1 tag=$2 port=$3; shift 3
  HIPFIRE_HOME=$(mktemp -d) "$bin" serve "$L8B" --device gpu --gpu-layer-budget 16 --offload-exec passback \
    --parallel 16 --ctx-size 1024 --port $port >/dev/null 2>>"$OUT/serve-hipfire.log" &
  local P=$!; wait_up $port && for c in "$@"; do load $port "$c" "$tag c$c"; done
  curl -s http://127.0.0.1:$port/metrics > "$OUT/serve-hipfire-metrics.txt"
  stop "$P"
}
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(head -1 $B/MANIFEST)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  echo "serve start $(el) s"
} > "$OUT/serve-env.txt"
hf $B/bin/hipfire hipfire 18190 1 4 8 16
"$LS" -m "$L8B" -ngl 16 -fa on -t 16 -np 16 -c 16384 --host 127.0.0.1 --port 18192 \
  >/dev/null 2>>"$OUT/serve-llama.log" &
P=$!; wait_up 18192 && for c in 1 4 8 16; do load 18192 "$c" "llama-server c$c"; done
stop "$P"
echo "serve done $(el) s" >> $OUT/serve-env.txt
(( $(el) < 480 )) && hf /root/hipfire-base base 18194 1 8
(( $(el) < 530 )) && hf $B/bin/hipfire hipfire-again 18196 1 8
echo "all done $(el) s" >> $OUT/serve-env.txt
