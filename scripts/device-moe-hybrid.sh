#!/usr/bin/env bash
# device-moe-hybrid.sh — MoE and hybrid (Gated DeltaNet) measurements of record, run ON THE GPU
# BOX: hipfire against llama.cpp built from the llama-cpp-python 0.3.36 sdist's vendored source,
# on the same synthetic files, in the same call.
#
#   scripts/device-moe-hybrid.sh prep     # llama-bench built and the $MODELS files written in the
#                                         # background while the carried GPU tier tests run
#   scripts/device-moe-hybrid.sh cpu      # CPU only, 16 threads: decode and pp512 per model
#                                         # (chain it right after `prep`: the box keeps its files
#                                         # while warm)
#   scripts/device-moe-hybrid.sh gpu      # GPU rows per $GPU_ROWS entry `model:format:engine:flags`
#                                         # against llama-bench's row of the same placement
#
# Carried: device-bundle/hipfire.gz (release binary, gzipped), device-bundle/tests/*.gz (GPU
# tier test executables, `gpu` only), and either .llamacpp/llama.cpp-src.tar.gz (built here,
# ~5 min with 16 jobs, static, sm_90, FlashAttention kernels on) or
# .llamacpp/llama-bin.tar.xz.part* (a llama-bench this script built earlier and sent back).
# MODELS (space-separated `preset:format`) picks the synthetic files; the box has 64 GiB of
# disk, so each file is deleted after its rows. Logs and JSON go to $OUT as one archive.
set -uo pipefail
: "${OUT:?runs on the device box, writes under \$OUT}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=/root/mh
mkdir -p "$WORK/bin" "$WORK/json"
LOG="$OUT/moe-hybrid.log"
HF="$WORK/bin/hipfire"
LB=/root/llama.cpp/build/bin/llama-bench
export HIPFIRE_KERNEL_CACHE=/tmp/hipfire-kernels
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# One thread per core of the box (16), as llama-bench's -t.
THREADS=${THREADS:-16}

log() { echo "$*" | tee -a "$LOG"; }

unpack() {
    for b in "$ROOT"/device-bundle/hipfire*.gz; do
        gunzip -c "$b" >"$WORK/bin/$(basename "$b" .gz)" && chmod +x "$WORK/bin/$(basename "$b" .gz)"
    done
    "$HF" version | tee -a "$LOG"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
    lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200 | tee -a "$LOG"
}

# llama-bench, static, for sm_90 with its FlashAttention kernels; back to $OUT in parts.
build_llama() {
    [[ -x "$LB" ]] && return 0
    if compgen -G "$ROOT/.llamacpp/llama-bin.tar.xz.part*" >/dev/null; then
        mkdir -p "$(dirname "$LB")" && cat "$ROOT"/.llamacpp/llama-bin.tar.xz.part* | tar xJf - -C "$(dirname "$LB")"
        [[ -x "$LB" ]] && return 0
    fi
    local src=/root/llama.cpp
    mkdir -p /root && tar xzf "$ROOT/.llamacpp/llama.cpp-src.tar.gz" -C /root || return 1
    cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA_NCCL=OFF \
        -DCMAKE_BUILD_TYPE=Release >"$WORK/llama-cmake.log" 2>&1 &&
        cmake --build "$src/build" --target llama-bench -j "${JOBS:-16}" >"$WORK/llama-build.log" 2>&1 || {
        tail -30 "$WORK/llama-build.log" >>"$LOG"
        return 1
    }
    strip "$LB"
    # Files come back 16 MiB at most.
    tar cJf - -C "$(dirname "$LB")" llama-bench | split -b 15M - "$OUT/llama-bin.tar.xz.part"
}

synth() { # preset format -> path
    local p="$WORK/$1-$2.gguf"
    [[ -f "$p" ]] || "$HF" synth --arch "$1" --format "$2" --out "$p" >>"$WORK/synth.log" 2>&1
    echo "$p"
}

row() { # json-file -> "test tok/s" pairs
    python3 - "$1" <<'EOF' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))
print("  ".join("%s %.1f" % (r.get("test") or ("pp%d" % r["n_prompt"] if r.get("n_prompt") else "tg%d" % r["n_gen"]), r["avg_ts"]) for r in rows))
EOF
}

cpu_round() { # model tag round
    local m=$1 tag=$2 r=$3
    local hj="$WORK/json/$tag-r$r-hipfire-cpu.json" lj="$WORK/json/$tag-r$r-llama-cpu.json"
    run_h() { timeout 400 "$HF" bench "$m" --device cpu --threads "$THREADS" -p "${PP:-512}" -n "${TG:-32}" \
        -r "${REPS:-2}" --json >"$hj" 2>>"$WORK/hipfire.log"; log "  hipfire rc=$? $(row "$hj")"; }
    # No CUDA device visible: llama.cpp runs every op on the CPU backend.
    run_l() { CUDA_VISIBLE_DEVICES="" timeout 400 "$LB" -m "$m" -p "${PP:-512}" -n "${TG:-32}" \
        -r "${REPS:-2}" -t "$THREADS" -ngl 0 -fa 1 -o json >"$lj" 2>>"$WORK/llama.log"; log "  llama   rc=$? $(row "$lj")"; }
    if (( r % 2 == 1 )); then run_h; run_l; else run_l; run_h; fi
}

run_gpu_tests() {
    for t in "$ROOT"/device-bundle/tests/*.gz; do
        [[ -e "$t" ]] || continue
        exe="$WORK/bin/$(basename "$t" .gz)"
        gunzip -c "$t" >"$exe" && chmod +x "$exe"
        log "== $(basename "$exe")"
        timeout 300 "$exe" --include-ignored --test-threads 1 ${TESTS:-} 2>&1 | grep -v "^$" |
            tee -a "$WORK/tests.log" | grep -E "test result|FAILED|panicked" | tee -a "$LOG"
    done
}

MODELS=${MODELS:-"qwen3-30b-a3b:q4_k gpt-oss-20b:mxfp4 qwen3.5-9b:q4_k"}
case "${1:-}" in
prep)
    unpack
    build_llama &
    # Every file written while llama.cpp builds (synth is one thread each).
    for mf in $MODELS; do synth "${mf%%:*}" "${mf##*:}" >/dev/null & done
    run_gpu_tests
    wait
    df -h /root | tail -1 | tee -a "$LOG"
    ls -la "$WORK"/*.gguf "$LB" 2>&1 | tee -a "$LOG"
    ;;
cpu)
    [[ -x "$HF" ]] || unpack
    build_llama || { log "no llama-bench"; exit 1; }
    for mf in $MODELS; do
        m=$(synth "${mf%%:*}" "${mf##*:}")
        tag="${mf%%:*}-${mf##*:}"
        log "== $tag ($(du -h "$m" | cut -f1)) CPU only, $THREADS threads"
        for r in 1 2; do cpu_round "$m" "$tag" "$r"; done
        rm -f "$m"
    done
    ;;
gpu)
    [[ -x "$HF" ]] || unpack
    build_llama || { log "no llama-bench"; exit 1; }
    # An entry: preset:format:hipfire-binary:hipfire flags (',' for ' '):llama-bench flags.
    for r in ${ROUNDS:-1 2}; do
        for e in ${GPU_ROWS:?}; do
            IFS=: read -r preset fmt bin hflags lflags <<<"$e"
            m=$(synth "$preset" "$fmt")
            tag="$preset-$fmt-$bin-${hflags//[, =]/_}"
            hj="$WORK/json/$tag-r$r-hipfire.json" lj="$WORK/json/$tag-r$r-llama.json"
            log "== $tag round $r"
            run_h() { timeout 300 "$WORK/bin/$bin" bench "$m" --device gpu ${hflags//,/ } -p "${PP:-512}" \
                -n "${TG:-64}" -r "${REPS:-2}" --json >"$hj" 2>>"$WORK/hipfire.log"; log "  hipfire rc=$? $(row "$hj")"; }
            run_l() { timeout 300 "$LB" -m "$m" -p "${PP:-512}" -n "${TG:-64}" -r "${REPS:-2}" -t "$THREADS" \
                -fa 1 ${lflags//,/ } -o json >"$lj" 2>>"$WORK/llama.log"; log "  llama   rc=$? $(row "$lj")"; }
            if (( r % 2 == 1 )); then run_h; run_l; else run_l; run_h; fi
        done
    done
    ;;
*)
    sed -n 2,17p "$0"
    exit 2
    ;;
esac
tar czf "$OUT/moe-hybrid-${1}.tar.gz" -C "$WORK" json $(cd "$WORK" && ls ./*.log 2>/dev/null)
