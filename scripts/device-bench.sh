#!/usr/bin/env bash
# device-bench.sh — the decode/offload measurements of record, run ON THE GPU BOX from the bundle
# that `scripts/device-check.sh build` (plus the extra programs below) put in device-bundle/.
#
#   scripts/device-bench.sh stash  PART      # keep a carried file (e.g. a model half) in /root/stash
#   scripts/device-bench.sh smoke            # GPU tier tests + a short single-layer run
#   scripts/device-bench.sh full             # GPU tier, 8B synth, single layer, offload-bench, decode
#   scripts/device-bench.sh llama            # llama.cpp CUDA build (~4 min) + hipfire and llama-bench
#                                            # on the same 8B synth, interleaved, same run
#
# SmolLM2 (98 MB) is over one call's 64 MiB carry limit, so it travels in two halves over two
# back-to-back calls (the box stays warm for 30 s): here, `head -c 49181216 GGUF > .smol/smol.part0;
# tail -c +49181217 GGUF > .smol/smol.part1`; call 1 carries `.smol/smol.part0` and runs `stash
# .smol/smol.part0`; call 2 carries `.smol/smol.part1` (+ the bundle) and runs `full`, which joins
# them and runs the SmolLM2 GPU parity test (gpu_smollm2) too.
#
# Logs and JSON go to $OUT. llama.cpp is built from the source that the llama-cpp-python sdist
# vendors (carried as .llamacpp/llama.cpp-src.tar.gz, models/ and docs/ stripped).
set -uo pipefail
: "${OUT:?runs on the device box, writes under \$OUT}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B="$ROOT/${BUNDLE:-device-bundle}"
STASH=/root/stash
mkdir -p "$STASH"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels HIPFIRE_GPU_TESTS=1
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SMOL="$STASH/SmolLM2-135M-Instruct.Q4_1.gguf"
L8B=/root/synth-llama3-8b-q4k.gguf

assemble_smol() {
    if [[ ! -f "$SMOL" && -f "$STASH/smol.part0" && -f "$ROOT/.smol/smol.part1" ]]; then
        cat "$STASH/smol.part0" "$ROOT/.smol/smol.part1" > "$SMOL"
    fi
    [[ -f "$SMOL" ]] && export HIPFIRE_SMOLLM2_GGUF="$SMOL"
}

run_tests() {
    for t in "$B"/tests/*; do
        [[ "$(basename "$t")" == *"${1:-}"* ]] || continue
        echo "== $(basename "$t")"
        timeout 300 "$t" --test-threads 1 --nocapture 2>&1 | grep -v "^$" | tail -40
    done
}

build_llama() {
    local src=/root/llama.cpp
    [[ -x "$src/build/bin/llama-bench" ]] && return 0
    mkdir -p /root && tar xzf "$ROOT/.llamacpp/llama.cpp-src.tar.gz" -C /root
    cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/llama-cmake.log" 2>&1 &&
        cmake --build "$src/build" --target llama-bench -j 16 >"$OUT/llama-build.log" 2>&1
}

case "${1:-}" in
stash)
    cp "$ROOT/$2" "$STASH/" && ls -la "$STASH"
    ;;
smoke)
    echo "== $(cat "$B/MANIFEST" | tr '\n' ' ')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$B/bin/hipfire" version
    run_tests gpu 2>&1 | tee "$OUT/smoke-tests.log"
    "$B/bin/single_layer" --reps 5 2>&1 | tee "$OUT/smoke-single-layer.log"
    ;;
full)
    assemble_smol
    echo "== $(cat "$B/MANIFEST" | tr '\n' ' ')" | tee "$OUT/full.log"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee -a "$OUT/full.log"
    "$B/bin/hipfire" version | tee -a "$OUT/full.log"
    # The 8B synthetic model is written while the GPU tier runs (neither is a measurement).
    ( [[ -f "$L8B" ]] || "$B/bin/hipfire" synth --arch llama3-8b --format q4_k --out "$L8B" >>"$OUT/full.log" 2>&1 ) &
    SY=$!
    run_tests "${TESTS:-gpu_}" 2>&1 | tee "$OUT/tests.log" | grep -E "^==|test result|panicked|max |gpu |auto share|split at" | tail -60
    wait $SY
    echo "synth rc=$?" | tee -a "$OUT/full.log"
    "$B/bin/single_layer" --reps 15 --sweep --json "$OUT/single_layer.json" 2>&1 | tee -a "$OUT/full.log"
    timeout 120 "$B/bin/hipfire" offload-bench --format q4_k,q8_0,q4_0 --k 4096 --json >"$OUT/offload_bench.json" 2>>"$OUT/full.log"
    echo "offload-bench rc=$?" | tee -a "$OUT/full.log"
    for budget in 32 24 16 8; do
        modes="pcie"
        [[ $budget -lt 32 ]] && modes="cpu,pcie,passback"
        [[ $budget -eq 16 ]] && export HIPFIRE_CPU_EXEC_TRACE=1
        timeout 150 "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget $budget --offload-exec $modes \
            --prompt-tokens 16 --gen-tokens 48 --rounds 2 --json >"$OUT/bench-b$budget.json" 2>>"$OUT/full.log"
        echo "budget $budget rc=$?" | tee -a "$OUT/full.log"
        unset HIPFIRE_CPU_EXEC_TRACE
    done
    ;;
llama)
    # Same-run comparison with llama.cpp on the synthetic 8B: llama-bench -ngl N keeps the last N
    # layers on the GPU (hipfire's --gpu-layer-budget N does the same); -ot puts the output head
    # on the GPU too, as hipfire always does.
    ( [[ -f "$L8B" ]] || "$B/bin/hipfire" synth --arch llama3-8b --format q4_k --out "$L8B" >>"$OUT/llama.log" 2>&1 )
    build_llama || { echo "llama.cpp build failed (see llama-build.log)"; exit 1; }
    LB=/root/llama.cpp/build/bin/llama-bench
    # Results gathered in one archive: the device tool brings back at most 8 files.
    R=/tmp/llama-run; rm -rf "$R"; mkdir -p "$R"
    for round in 1 2; do
        for budget in 32 24 16 8; do
            modes=pcie
            [[ $budget -lt 32 ]] && modes=cpu,pcie,passback
            for m in ${modes//,/ }; do
                timeout 150 "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget $budget \
                    --offload-exec $m --prompt-tokens 16 --gen-tokens 64 --rounds 1 --json \
                    >"$R/r$round-hipfire-b$budget-$m.json" 2>>"$OUT/llama.log"
            done
            ngl=$budget; [[ $budget -eq 32 ]] && ngl=99
            "$LB" -m "$L8B" -p 0 -n 64 -t 16 -ngl $ngl -ot "output=CUDA0" -o json \
                >"$R/r$round-llama-ngl$ngl.json" 2>>"$OUT/llama.log"
            echo "round $round budget $budget done" | tee -a "$OUT/llama.log"
        done
    done
    tar czf "$OUT/llama-run.tar.gz" -C /tmp llama-run
    ;;
*)
    sed -n 2,18p "$0"
    exit 2
    ;;
esac
