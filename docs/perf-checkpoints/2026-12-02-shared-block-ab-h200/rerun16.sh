#!/usr/bin/env bash
# The follow-up call (same warm box, bundle already unpacked in /root/d2): six more interleaved
# rounds of tg64 at 16 of 32 layers resident, passback flags, order alternating per round.
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib" HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
B=/root/d2/bin; R=$OUT/ab16.jsonl
for round in 1 2 3 4 5 6; do for bin in hipfire-base hipfire; do
  [[ $((round%2)) == 0 ]] && bin=$([[ $bin == hipfire ]] && echo hipfire-base || echo hipfire)
  timeout 60 $B/$bin bench /root/l8b.gguf --device gpu --gpu-layer-budget 16 --offload-exec passback \
    -p 0 -n 64 -r 1 --json 2>/dev/null | python3 -c "
import sys,json
for r in json.load(sys.stdin): print(json.dumps({'bin':'$bin','budget':16,'round':$round,'test':r['test'],'ts':r['avg_ts']}))" >> $R
done; done
