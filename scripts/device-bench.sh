#!/usr/bin/env bash
# device-bench.sh — the decode/offload measurements of record, run ON THE GPU BOX from a bundle
# of release programs and GPU-tier test executables (bin/, tests/, MANIFEST).
#
#   scripts/device-bench.sh stash FILE...     # keep carried files in /root/stash (a *.tgz is unpacked
#                                             # there: ship the bundle gzipped to fit the carry limit)
#   scripts/device-bench.sh smoke             # GPU tier tests + a short single-layer run
#   scripts/device-bench.sh smollm2           # join the SmolLM2 halves, run the gpu_smollm2 parity test
#   scripts/device-bench.sh verify            # bench orchestration, auto budget, ram margin on the 8B synth
#   scripts/device-bench.sh full              # GPU tier, 8B synth, single layer, offload-bench, decode
#   scripts/device-bench.sh per-shape         # single_layer --per-shape: auto vs pinned shares per shape
#                                             # (CHAIN, REPS; JOINS, PROJS: the joins and
#                                             # projections tabled; H2H_ROUNDS: rounds per row
#                                             # (15); VARIANTS: one flags auto per
#                                             # tuning, raced together)
#   scripts/device-bench.sh handshake         # each join's per-step cost (single_layer --handshake),
#                                             # then one layer with the flags timeline on
#   scripts/device-bench.sh ab                # flags knobs raced against the default in interleaved
#                                             # rounds (single_layer --ab-rounds; VARIANTS, ROUNDS)
#   scripts/device-bench.sh targets           # the layer targets in interleaved rounds
#                                             # (single_layer --target-rounds; CHAINS, ROUNDS, VARIANTS)
#   scripts/device-bench.sh llama-build       # llama.cpp CUDA llama-bench (~4 min), or unpack a carried one
#   scripts/device-bench.sh llama-round N     # one round: hipfire and llama-bench on the same 8B synth
#                                             # (JOIN=two-stream|flags picks hipfire's join strategy)
#   scripts/device-bench.sh strategies        # 8B decode per join strategy at 24 and 16 resident, traced
#
# Each call's files travel under a 64 MiB limit and the box stays warm ~30 s between calls, so a
# session chains calls: the bundle goes gzipped (`tar czf lead-bundle.tgz lead-bundle`, ~9 MB) and is
# stashed; SmolLM2 (98 MB) travels as two halves (`head -c 49181216 GGUF > .smol/smol.part0;
# tail -c +49181217 GGUF > .smol/smol.part1`), the first stashed, the second carried by the call
# that runs `smollm2`. A built llama-bench comes back as .llamacpp/llama-bin.tar.xz.part* (static,
# sm_90) and is carried instead of the source afterwards.
#
# Logs and JSON go to $OUT. llama.cpp is built from the source that the llama-cpp-python sdist
# vendors (carried as .llamacpp/llama.cpp-src.tar.gz, models/ and docs/ stripped).
set -uo pipefail
: "${OUT:?runs on the device box, writes under \$OUT}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STASH=/root/stash
mkdir -p "$STASH"
# The bundle: $BUNDLE (default device-bundle, what `scripts/device-check.sh build` fills) in the
# repo, else the same name unpacked in the stash.
B="$ROOT/${BUNDLE:-device-bundle}"
[[ -d "$B" ]] || B="$STASH/${BUNDLE:-device-bundle}"
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
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
        # The real-weights tests demand their files: SmolLM2 runs from `smollm2` once the halves
        # are joined, the slim Gemma 3 where HIPFIRE_GEMMA3_SLIM_GGUF names it.
        [[ "$(basename "$t")" == *gpu_smollm2 && -z "${HIPFIRE_SMOLLM2_GGUF:-}" ]] && continue
        [[ "$(basename "$t")" == *gpu_gemma3_slim && -z "${HIPFIRE_GEMMA3_SLIM_GGUF:-}" ]] && continue
        echo "== $(basename "$t")"
        # The GPU-tier tests are #[ignore]d (they need a GPU): run them with the rest.
        timeout 300 "$t" --include-ignored --test-threads 1 --nocapture 2>&1 | grep -v "^$" | tail -40
    done
}

LB=/root/llama.cpp/build/bin/llama-bench
build_llama() {
    local src=/root/llama.cpp
    [[ -x "$LB" ]] && return 0
    if compgen -G "$ROOT/.llamacpp/llama-bin.tar.xz.part*" >/dev/null; then
        mkdir -p "$src/build/bin" && cat "$ROOT"/.llamacpp/llama-bin.tar.xz.part* | tar xJf - -C "$src/build/bin"
        [[ -x "$LB" ]] && return 0
    fi
    mkdir -p /root && tar xzf "$ROOT/.llamacpp/llama.cpp-src.tar.gz" -C /root
    # Static, so that the one binary can come back and be carried next time (no 4-minute rebuild).
    cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/llama-cmake.log" 2>&1 &&
        cmake --build "$src/build" --target llama-bench -j 16 >"$OUT/llama-build.log" 2>&1 || return 1
    strip "$LB"
    tar cJf - -C "$src/build/bin" llama-bench | split -b 15M - "$OUT/llama-bin.tar.xz.part"
    ls -la "$OUT"/llama-bin.tar.xz.part* "$LB"
}

case "${1:-}" in
stash)
    shift
    for f in "$@"; do
        case "$f" in
        *.tgz) tar xzf "$ROOT/$f" -C "$STASH" ;;
        *) cp "$ROOT/$f" "$STASH/" ;;
        esac
    done
    ls -la "$STASH"
    ;;
smollm2)
    assemble_smol
    [[ -n "${HIPFIRE_SMOLLM2_GGUF:-}" ]] || { echo "no SmolLM2 halves (see the header)"; exit 1; }
    run_tests gpu_smollm2 2>&1 | tee "$OUT/smollm2.log"
    ;;
verify)
    # Late changes that need a GPU: fresh-process interleaved rounds, `auto` budget from free
    # VRAM, and the RAM margin refusing an impossible placement.
    ( [[ -f "$L8B" ]] || "$B/bin/hipfire" synth --arch llama3-8b --format q4_k --out "$L8B" >>"$OUT/verify.log" 2>&1 )
    "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget 24 --offload-exec cpu,passback \
        --prompt-tokens 8 --gen-tokens 16 --rounds 2 --json >"$OUT/verify-rounds.json" 2>>"$OUT/verify.log"
    echo "rounds rc=$?" | tee -a "$OUT/verify.log"
    "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget auto --prompt-tokens 8 --gen-tokens 16 \
        --rounds 1 2>&1 | tee -a "$OUT/verify.log" | grep -iE "placed|resident|spill|tok/s" | head -8
    HIPFIRE_RAM_MARGIN_MIB=200000 "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget 8 \
        --prompt-tokens 8 --gen-tokens 8 --rounds 1 2>&1 | tail -3 | tee -a "$OUT/verify.log"
    ;;
per-shape)
    # Each shape's step is 50-300 us: enough reps that one point is tens of milliseconds.
    # CHAIN queues that many layers' steps back to back per timed rep, as decode does.
    # VARIANTS (e.g. default,chunks-8): one flags auto per tuning, raced against the same rivals
    # (which run the first); JOINS (e.g. flags) and PROJS (e.g. q,k) limit the table.
    "$B/bin/single_layer" --reps "${REPS:-200}" --chain "${CHAIN:-1}" --target-rounds 0 --per-shape \
        ${VARIANTS:+--flags-variants "$VARIANTS"} ${JOINS:+--per-shape-joins "$JOINS"} \
        ${PROJS:+--per-shape-projs "$PROJS"} ${H2H_ROUNDS:+--h2h-rounds "$H2H_ROUNDS"} --json "$OUT/per_shape.json" 2>&1 | tee "$OUT/per-shape.log"
    ;;
handshake)
    for t in ${THREADS:-0}; do
        "$B/bin/single_layer" --handshake "${STEPS:-2000}" --threads "$t" 2>&1 | tee -a "$OUT/handshake.log"
    done
    "$B/bin/single_layer" --reps "${REPS:-200}" --timeline --json "$OUT/single_layer_timeline.json" 2>&1 |
        tee "$OUT/single_layer_timeline.log" | tail -12
    ;;
ab)
    # The default list races the default against seq-x, the fenced publish of
    # `memory.flags_x_publish = fenced` (tagged x ran the layer 1.010x as fast, the 2026-11-30
    # cpu-idle record 05). A knob still under measurement (publish-blocks-N) needs a
    # single_layer built with `--features experiments`.
    "$B/bin/single_layer" --reps "${REPS:-200}" --ab-rounds "${ROUNDS:-9}" \
        --flags-variants "${VARIANTS:-default,seq-x}" --json "$OUT/ab.json" 2>&1 |
        tee "$OUT/ab.log" | grep -A8 "flags A/B"
    ;;
targets)
    # The issue's layer targets in interleaved rounds, with a host sync around every layer
    # (chain 1) and with 8 layers queued back to back as the decoder queues a token's (chain 8).
    for chain in ${CHAINS:-1 8}; do
        "$B/bin/single_layer" --reps "${REPS:-200}" --chain "$chain" --target-rounds "${ROUNDS:-9}" \
            ${VARIANTS:+--flags-variants "$VARIANTS"} \
            --json "$OUT/targets-chain$chain.json" 2>&1 | tee "$OUT/targets-chain$chain.log" | tail -16
    done
    ;;
strategies)
    ( [[ -f "$L8B" ]] || "$B/bin/hipfire" synth --arch llama3-8b --format q4_k --out "$L8B" >>"$OUT/strategies.log" 2>&1 )
    for budget in 24 16; do
        for st in ordering two-stream flags; do
            HIPFIRE_CPU_EXEC_TRACE=1 timeout 150 "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget $budget \
                --offload-exec passback --join-strategy $st --prompt-tokens 16 --gen-tokens 64 --rounds 2 --json \
                >"$OUT/strat-b$budget-$st.json" 2>"$OUT/trace-b$budget-$st.log"
            echo "budget $budget $st rc=$? $(python3 -c 'import json,sys; print(" ".join("%s %.2f" % (r["test"], r["avg_ts"]) for r in json.load(open(sys.argv[1]))))' "$OUT/strat-b$budget-$st.json" 2>/dev/null)" | tee -a "$OUT/strategies.log"
            python3 "$ROOT/scripts/trace_overhead.py" "$OUT/trace-b$budget-$st.log" | tail -1 | sed "s/^/b$budget $st: /" | tee -a "$OUT/strategies.log"
        done
    done
    # At most 8 files come back: one archive.
    tar czf "$OUT/strategies.tar.gz" -C "$OUT" strategies.log $(cd "$OUT" && ls strat-*.json trace-*.log) &&
        rm -f "$OUT"/strat-*.json "$OUT"/trace-*.log
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
llama-build)
    build_llama || { echo "llama.cpp build failed (see llama-build.log)"; tail -20 "$OUT/llama-build.log"; exit 1; }
    "$LB" --help | head -3
    ;;
llama-round)
    # Same-run comparison with llama.cpp on the synthetic 8B: llama-bench -ngl N keeps the last N
    # layers on the GPU (hipfire's --gpu-layer-budget N does the same); -ot puts the output head
    # on the GPU too, as hipfire always does. Call once per round; the order alternates by round.
    round=${2:?round number}
    ( [[ -f "$L8B" ]] || "$B/bin/hipfire" synth --arch llama3-8b --format q4_k --out "$L8B" >>"$OUT/llama.log" 2>&1 )
    build_llama || { echo "no llama-bench: run llama-build first"; exit 1; }
    R=/root/llama-run; mkdir -p "$R"
    for budget in 32 24 16 8; do
        modes=pcie
        [[ $budget -lt 32 ]] && modes="cpu pcie passback"
        ngl=$budget; [[ $budget -eq 32 ]] && ngl=99
        run_llama() {
            "$LB" -m "$L8B" -p 0 -n 64 -r 3 -t 16 -ngl $ngl -ot "output=CUDA0" -o json \
                >"$R/r$round-llama-ngl$ngl.json" 2>>"$OUT/llama.log"
        }
        (( round % 2 == 0 )) && run_llama
        for m in $modes; do
            timeout 150 "$B/bin/hipfire" bench "$L8B" --device gpu --gpu-layer-budget $budget \
                --offload-exec $m ${JOIN:+--join-strategy $JOIN} --prompt-tokens 16 --gen-tokens 64 --rounds 2 --json \
                >"$R/r$round-hipfire-b$budget-$m.json" 2>>"$OUT/llama.log"
        done
        (( round % 2 == 1 )) && run_llama
        echo "round $round budget $budget done $(date +%T)" | tee -a "$OUT/llama.log"
    done
    tar czf "$OUT/llama-run.tar.gz" -C /root llama-run
    ;;
*)
    sed -n 2,20p "$0"
    exit 2
    ;;
esac
