#!/usr/bin/env bash
# Device call (run from the repository root on the H200 box), nothing else running:
#  1. in the background: llama.cpp's llama-bench built CPU-only (GGML_NATIVE: AVX-512, VNNI, AMX)
#     from the llama-cpp-python 0.3.36 sdist's vendored source, and the synthetic Llama-3-8B Q4_K;
#  2. quiet: CPU GEMV per format against a plain read of the same bytes, 16 threads, three runs;
#  3. quiet: CPU prefill pp512 at 16 threads: hipfire with 128 / 256 / 512-token AMX chunks and
#     llama-bench (CPU build), interleaved, two rounds.
# Carried in dev-lead/: bundle.tgz (bin/) and llama.cpp-src.tar.gz.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=/root/d; rm -rf $B; mkdir -p $B && tar xzf dev-lead/bundle.tgz -C $B
cat $B/MANIFEST > $OUT/env.txt; lscpu | grep -iE "model name|^CPU\(s\)|Thread|NUMA" >> $OUT/env.txt
grep -oE "amx[a-z_0-9]*|avx512_vnni|gfni|avx512_vbmi" /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/env.txt; echo >> $OUT/env.txt
L8B=/root/l8b.gguf; src=/root/llama.cpp; LB=$src/build/bin/llama-bench
( [[ -f $L8B ]] || $B/bin/hipfire synth --arch llama3-8b --format q4_k --out $L8B > /root/synth.log 2>&1 ) &
SP=$!
( tar xzf dev-lead/llama.cpp-src.tar.gz -C /root &&
  cmake -S $src -B $src/build -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_BUILD_TYPE=Release > /root/llama-cmake.log 2>&1 &&
  timeout 240 cmake --build $src/build --target llama-bench -j 16 > /root/llama-build.log 2>&1 ) &
BP=$!
$B/bin/hipfire version --json > $OUT/version.json 2>&1
wait $BP; echo "llama-bench build rc $? at $(el) s" | tee $OUT/log.txt; tail -2 /root/llama-build.log >> $OUT/log.txt
wait $SP; tail -1 /root/synth.log >> $OUT/log.txt; echo "synth at $(el) s" >> $OUT/log.txt
# 2. formats, three runs per width.
for run in 1 2 3; do
  for k in 4096 14336; do
    echo "== run $run k $k ($(el) s)"
    timeout 100 $B/bin/gemv_gbs --formats q4_k,q3_k,q2_k,iq4_xs,iq4_nl,q5_0,q5_1,q5_k --k $k --m 4096 \
      --threads 16 --footprint-mib 2048 --reps 9 2>&1
  done
done > $OUT/formats.log 2>&1
echo "formats done $(el) s" >> $OUT/log.txt
# 3. CPU prefill at 16 threads (GPU not used: --device cpu; llama-bench is a CPU-only build).
: > $OUT/cpu-prefill.jsonl
hb() { timeout 120 $B/bin/$1 bench $L8B --device cpu --threads 16 -p 512 -n 0 -r 2 --json 2>>$OUT/cpu-prefill.err |
  python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'$1','round':$2,'test':r['test'],'avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts')}))" >> $OUT/cpu-prefill.jsonl; }
lb() { timeout 120 $LB -m $L8B -p 512 -n 0 -t 16 -r 2 -o json 2>>$OUT/cpu-prefill.err | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'engine':'llama.cpp','round':$1,'test':'pp512','avg_ts':r['avg_ts'],'samples_ts':r.get('samples_ts'),'backends':r.get('backends'),'cpu_info':r.get('cpu_info')}))" >> $OUT/cpu-prefill.jsonl; }
for round in 1 2; do
  (( $(el) < 470 )) || break
  hb hipfire $round; hb hipfire-c256 $round; hb hipfire-c512 $round; lb $round
  echo "round $round at $(el) s" >> $OUT/log.txt
done
echo "done $(el) s" >> $OUT/log.txt
cat $OUT/log.txt; grep -v "^$" $OUT/formats.log | tail -70; cut -c1-160 $OUT/cpu-prefill.jsonl
