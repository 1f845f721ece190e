#!/usr/bin/env bash
# The second device call of this record, on the same warm box right after call.sh (its bundle,
# synthetic model and llama-bench still in place): the k 4096 formats twice more and a third
# CPU prefill round of each engine. Files land in raw-rerun/.
set -uo pipefail
B=/root/d
for i in 1 2; do
  $B/bin/gemv_gbs --formats q4_k,q3_k,q2_k,iq4_xs --k 4096 --m 4096 --threads 16 --footprint-mib 2048 --reps 7 2>&1 | tail -4
done | tee $OUT/formats-k4096-again.log
timeout 40 $B/bin/hipfire bench /root/l8b.gguf --device cpu --threads 16 -p 512 -n 0 -r 2 --json > $OUT/hb3.json
timeout 30 /root/llama.cpp/build/bin/llama-bench -m /root/l8b.gguf -p 512 -n 0 -t 16 -r 2 -o json > $OUT/lb3.json
