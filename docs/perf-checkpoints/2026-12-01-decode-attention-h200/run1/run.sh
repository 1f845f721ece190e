#!/usr/bin/env bash
# Device run for the longctx branch: GPU tests, attention timing, hipfire bench new vs old.
set -u
B=dev-longctx
export HIPFIRE_GPU_TESTS=1 HIPFIRE_KERNEL_CACHE=/tmp/hk
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for f in $B/bin/*.gz $B/tests/*.gz; do gunzip -f "$f"; done
chmod +x $B/bin/* $B/tests/*
{ date -u; cat $B/MANIFEST; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; nproc; free -g; } > $OUT/env.txt 2>&1
T0=$(date +%s)
echo "== gpu_attention $(date -u +%T)" >> $OUT/tests.log
timeout 150 $B/tests/hipfire-model--gpu_attention --test-threads=1 --nocapture >> $OUT/tests.log 2>&1; echo "rc $?" >> $OUT/tests.log
echo "== attention_timing $(date -u +%T)" >> $OUT/tests.log
timeout 90 $B/bin/attention_timing --json $OUT/attention.jsonl > $OUT/attention.log 2>&1; echo "rc $?" >> $OUT/tests.log
echo "== gpu_synth $(date -u +%T)" >> $OUT/tests.log
timeout 180 $B/tests/hipfire-model--gpu_synth --test-threads=1 --nocapture >> $OUT/tests.log 2>&1; echo "rc $?" >> $OUT/tests.log
echo "== synth $(date -u +%T)" >> $OUT/bench.log
timeout 200 $B/bin/hipfire synth --arch llama3-8b --format q4_k --out /tmp/m.gguf >> $OUT/bench.log 2>&1; echo "rc $?" >> $OUT/bench.log
for d in 16 1024 4096; do
  for v in hipfire hipfire-old; do
    [ "$v" = hipfire-old ] && [ "$d" = 4096 ] && continue
    echo "== $v bench --prompt-tokens $d --gen-tokens 32 --rounds 1 $(date -u +%T)" >> $OUT/bench.log
    timeout 120 $B/bin/$v bench /tmp/m.gguf --device gpu --prompt-tokens $d --gen-tokens 32 --rounds 1 --json > $OUT/bench-$v-$d.json 2>> $OUT/bench.log; echo "rc $?" >> $OUT/bench.log
  done
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s" >> $OUT/bench.log
tail -5 $OUT/tests.log; grep -E "test result|rc " $OUT/tests.log; cat $OUT/attention.log | head -40; tail -30 $OUT/bench.log
