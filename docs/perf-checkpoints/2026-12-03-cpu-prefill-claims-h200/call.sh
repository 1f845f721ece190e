#!/usr/bin/env bash
# Device call (run from the repository root on the H200 box), CPU only, nothing else running
# during the measurements:
#  1. in the background: llama.cpp's llama-bench built CPU-only (GGML_NATIVE: AVX-512, VNNI, AMX)
#     from the llama-cpp-python 0.3.36 sdist's vendored source (or the binary carried back from
#     an earlier call), and the synthetic Llama-3-8B Q4_K; meanwhile the CPU test executables of
#     hipfire-exec and hipfire-quant (AMX hardware tests included);
#  2. quiet: the AMX micro-kernel's ceiling and the GEMM per shape, one thread (prefill_gemm,
#     $SWEEP: the k-block and panel-group lists);
#  3. quiet: CPU prefill pp512 at 16 threads, $ROUNDS interleaved rounds of each binary of
#     $BINS (this tree and a baseline) and llama-bench (FA off and on), hipfire's per-step
#     breakdown logged (RUST_LOG=hipfire::prefill=debug).
# Carried: device-bundle/bundle.tgz (bin/, tests/) and .llamacpp/llama.cpp-src.tar.gz.
set -uo pipefail
: "${OUT:?}"
ROUNDS=${ROUNDS:-3}
BINS=${BINS:-"hipfire hipfire-base"}
SWEEP=${SWEEP:-}
GEMM_TOKENS=${GEMM_TOKENS:-128,512}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xzf device-bundle/bundle.tgz -C $B
cat $B/MANIFEST > $OUT/env.txt; lscpu | grep -iE "model name|^CPU\(s\)|Thread|NUMA|MHz" >> $OUT/env.txt
grep -oE "amx[a-z_0-9]*|avx512_vnni|avx512_bf16" /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/env.txt; echo >> $OUT/env.txt
L8B=/root/l8b.gguf; src=/root/llama.cpp; LB=$src/build/bin/llama-bench
( [[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /root/synth.log 2>&1 ) &
SP=$!
( if [[ -f .llamacpp/llama-bench-cpu.xz ]]; then mkdir -p $src/build/bin && xz -dc .llamacpp/llama-bench-cpu.xz > $LB && chmod +x $LB
  else tar xzf .llamacpp/llama.cpp-src.tar.gz -C /root &&
  cmake -S $src -B $src/build -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_BUILD_TYPE=Release > /root/llama-cmake.log 2>&1 &&
  timeout 300 cmake --build $src/build --target llama-bench -j 16 > /root/llama-build.log 2>&1 &&
  strip $LB && xz -c $LB > $OUT/llama-bench-cpu.xz; fi ) &
BP=$!
$B/bin/hipfire version --json > $OUT/version.json 2>&1
for t in $B/tests/*; do echo "== $(basename $t)"; timeout 200 $t --test-threads 4 2>&1 | grep -E "test result|FAILED|panicked|failed" | head -20; done > $OUT/tests.log 2>&1
echo "tests done $(el) s" > $OUT/log.txt
wait $BP; echo "llama-bench ready rc $? at $(el) s" >> $OUT/log.txt; tail -2 /root/llama-build.log >> $OUT/log.txt 2>/dev/null
wait $SP; tail -1 /root/synth.log >> $OUT/log.txt 2>/dev/null; echo "synth at $(el) s" >> $OUT/log.txt
# 2. one thread: micro-kernel ceiling and GEMM per shape.
timeout 150 $B/bin/prefill_gemm --amx hw --k 4096,14336 --m 1024 --tokens $GEMM_TOKENS --reps 3 $SWEEP > $OUT/prefill_gemm.log 2>&1
echo "prefill_gemm rc $? at $(el) s" >> $OUT/log.txt
# 3. pp512 at 16 threads, interleaved.
: > $OUT/cpu-prefill.jsonl
hb() { RUST_LOG=hipfire::prefill=debug timeout 150 $B/bin/$1 bench $L8B --device cpu --threads 16 -p 512 -n 0 -r 3 --json 2>>$OUT/breakdown-$1.log |
  python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'$1','round':$2,'test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts')}))" >> $OUT/cpu-prefill.jsonl; }
lb() { timeout 150 $LB -m $L8B -p 512 -n 0 -t 16 -r 3 -fa 0,1 -o json 2>>$OUT/llama.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'llama.cpp','round':$1,'test':'pp512','fa':r.get('flash_attn'),'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts'),'backends':r.get('backends'),'cpu_info':r.get('cpu_info')}))" >> $OUT/cpu-prefill.jsonl; }
for round in $(seq 1 $ROUNDS); do
  (( $(el) < 430 )) || break
  set -- $BINS; hb $1 $round; lb $round; shift; for b in "$@"; do hb $b $round; done
  echo "round $round at $(el) s" >> $OUT/log.txt
done
cd $OUT && tar czf breakdown.tgz breakdown-*.log && rm -f breakdown-*.log; cd - >/dev/null
echo "done $(el) s" >> $OUT/log.txt
cat $OUT/log.txt; grep -v "^$" $OUT/tests.log | tail -20; cat $OUT/prefill_gemm.log; cut -c1-200 $OUT/cpu-prefill.jsonl
