#!/usr/bin/env bash
# Interleaved base / new rounds of `hipfire bench` prefill on the CPU, 2 threads.
# Usage: run.sh BASE_BIN NEW_BIN MODEL TAG PROMPTS ROUNDS OUTDIR
set -euo pipefail
base=$1 new=$2 model=$3 tag=$4 prompts=$5 rounds=$6 out=$7
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  # Alternate which binary goes first so drift in the shared VM does not favour one side.
  if (( r % 2 )); then order="base new"; else order="new base"; fi
  for side in $order; do
    bin=$base; [[ $side == new ]] && bin=$new
    "$bin" bench "$model" -p "$prompts" -n 0 -r 1 --device cpu --threads 2 --json -q \
      > "$out/$tag-$side-r$r.json"
    echo "$tag $side round $r done"
  done
done
