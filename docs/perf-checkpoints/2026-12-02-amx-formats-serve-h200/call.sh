#!/usr/bin/env bash
# One device call (run from the repository root on the H200 box), nothing else running:
#  1. in the background: llama.cpp's llama-bench built CPU-only (GGML_NATIVE: AVX-512, VNNI, AMX)
#     from the llama-cpp-python 0.3.36 sdist's vendored source, and the synthetic Llama-3-8B Q4_K;
#     meanwhile the GPU tests of ride-along decode steps and the AMX tests (correctness only);
#  2. quiet: CPU GEMV per format against a plain read, base (b5e870a) and new, 16 threads;
#  3. quiet: CPU prefill pp512 at 16 threads: hipfire (AMX) and llama-bench CPU, two rounds;
#  4. quiet: hipfire serve, base and new, 16 of 32 layers spilled, passback, 1 and 8 streams.
# Carried in dev-lead/: bundle.tgz (bin/, tests/, MANIFEST) and llama.cpp-src.tar.gz.
set -uo pipefail
: "${OUT:?}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle.tgz -C $B
cat $B/MANIFEST > $OUT/env.txt; lscpu | grep -iE "model name" >> $OUT/env.txt
grep -oE "amx[a-z_0-9]*|avx512_vnni" /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/env.txt; echo >> $OUT/env.txt
L8B=/root/l8b.gguf; src=/root/llama.cpp; LB=$src/build/bin/llama-bench
( [[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /root/synth.log 2>&1 ) &
SP=$!
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S $src -B $src/build -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_BUILD_TYPE=Release > /root/llama-cmake.log 2>&1 &&
  timeout 200 cmake --build $src/build --target llama-bench -j 16 > /root/llama-build.log 2>&1 ) &
BP=$!
{
  for spec in "100 model--gpu_batch_decode" "40 model--gpu_decode_graphs" "60 model--gpu_prefill" \
              "45 hipfire-quant--lib amx" "45 hipfire-exec--lib gemv_tokens"; do
    set -- $spec; lim=$1; n=$2; shift 2
    echo "== $n $* ($(el) s)"
    timeout $lim $B/tests/$n --test-threads 1 "$@" 2>&1 | grep -E "^test |panicked|FAILED|test result|skipped|left|right" | head -60
  done
  echo "tests done $(el) s"
} > $OUT/tests.log 2>&1
wait $BP; echo "llama-bench build rc $? at $(el) s" >> $OUT/tests.log; tail -2 /root/llama-build.log >> $OUT/tests.log
wait $SP; tail -1 /root/synth.log >> $OUT/tests.log
grep -E "^== |test result|FAILED|panicked" $OUT/tests.log
# 2. formats, base then new per width.
for k in 4096 14336; do
  for bin in gemv_gbs-base gemv_gbs; do
    echo "== $bin k $k"
    timeout 90 $B/bin/$bin --formats q4_k,q3_k,q2_k,iq4_xs --k $k --m 4096 --threads 16 \
      --footprint-mib 2048 --reps 7 2>&1
  done
done > $OUT/formats.log 2>&1
echo "formats done $(el) s"; cat $OUT/formats.log | grep -v "^$" | tail -40
# 3. CPU prefill at 16 threads (GPU not used: --device cpu; llama-bench is a CPU-only build).
: > $OUT/cpu-prefill.jsonl
hb() { timeout 150 $B/bin/$1 bench $L8B --device cpu --threads 16 -p 512 -n 0 -r 2 --json 2>>$OUT/cpu-prefill.err |
  python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'$1','round':$2,'test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts')}))" >> $OUT/cpu-prefill.jsonl; }
lb() { timeout 150 $LB -m $L8B -p 512 -n 0 -t 16 -r 2 -o json 2>>$OUT/cpu-prefill.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'llama.cpp','round':$1,'test':'pp512','avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts'),'backends':r.get('backends'),'cpu_info':r.get('cpu_info')}))" >> $OUT/cpu-prefill.jsonl; }
hb hipfire 1; lb 1; hb hipfire 2; lb 2
echo "cpu prefill done $(el) s"; cut -c1-200 $OUT/cpu-prefill.jsonl
# 4. serve, base and new, same load.
serve() {
  local bin=$1 port=$2
  HIPFIRE_HOME=$(mktemp -d) $B/bin/$bin serve $L8B --device gpu --gpu-layer-budget 16 --offload-exec passback \
    --parallel 16 --ctx-size 1024 --port $port >/dev/null 2>>$OUT/serve-$bin.log &
  local P=$!
  for _ in $(seq 900); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
  for c in 1 8; do
    (( $(el) < 345 )) || break
    python3 scripts/serve_load.py --url http://127.0.0.1:$port --concurrency $c --seconds ${SECS:-10} \
      --max-tokens 64 --label "$bin c$c" >> $OUT/serve-raw.jsonl; echo >> $OUT/serve-raw.jsonl
  done
  kill -TERM $P; wait $P
}
: > $OUT/serve-raw.jsonl
(( $(el) < 290 )) && serve hipfire 18190
(( $(el) < 320 )) && serve hipfire-base 18192
echo "done $(el) s"; cut -c1-300 $OUT/serve-raw.jsonl
