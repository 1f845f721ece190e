#!/usr/bin/env bash
# Single-thread GEMM A/B of the row kernels (thread CPU time, so the shared box's load mostly
# drops out): prefill_gemm built at the baseline commit (BASE_BIN) and at this tree (NEW_BIN),
# interleaved, on the 8B's two row lengths and SmolLM2's (Q4_1, unchanged: the control).
# Build each: `cargo build --release -p hipfire-quant --example prefill_gemm` (the baseline with
# the example file copied into a checkout of the baseline commit).
# Usage: kernel-ab.sh BASE_BIN NEW_BIN [ROUNDS]
set -euo pipefail
BASE="$1"; NEW="$2"; ROUNDS="${3:-3}"
for r in $(seq "$ROUNDS"); do
  for who in base new; do
    bin=$BASE; [[ $who == new ]] && bin=$NEW
    for shape in "--k 4096 --m 2048 --formats q4_k" "--k 14336 --m 1024 --formats q4_k" \
                 "--k 576 --m 1536 --formats q4_1"; do
      echo "round $r $who $shape: $("$bin" $shape --tokens 32 --group 8 --reps 7 | tail -1)"
    done
  done
done
