#!/usr/bin/env bash
# device-check.sh — build the GPU tier here, run it on the GPU box.
#
#   scripts/device-check.sh build   # here (cargo available, no GPU): fills device-bundle/
#   scripts/device-check.sh run     # on the GPU box (no cargo): runs tests + benches, logs under $OUT
#
# device-bundle/ (git-ignored) holds self-contained x86-64 executables: test executables under
# tests/, programs under bin/, and a manifest. Kernels are embedded in the binaries (include_str!)
# and compiled there with NVRTC; libcuda/libnvrtc are loaded at run time.
#
# To add GPU tests or programs of another crate, extend the variables below.
set -euo pipefail

# Packages whose test executables form the GPU tier (its tests are #[ignore]d, needing a GPU;
# `run` passes --include-ignored so they run along with the rest).
GPU_TEST_PACKAGES=${GPU_TEST_PACKAGES:-"hipfire-gpu"}
# Examples to ship, as package:example.
GPU_EXAMPLES=${GPU_EXAMPLES:-"hipfire-gpu:gpu_bench"}
# Binaries to ship, as package:bin (added when the crate builds, e.g. hipfire-cli:hipfire).
GPU_BINS=${GPU_BINS:-""}
# Bench commands to run on the box, one per line; {bin} expands to the bundle's bin folder,
# {out} to $OUT.
GPU_BENCHES=${GPU_BENCHES:-"{bin}/gpu_bench --json {out}/gpu_bench.json
{bin}/gpu_bench --dequant --json {out}/gpu_dequant_bench.json"}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE="$ROOT/device-bundle"

build() {
    cd "$ROOT"
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE/tests" "$BUNDLE/bin"
    local pkgargs=()
    for p in $GPU_TEST_PACKAGES; do pkgargs+=(-p "$p"); done
    # Test executables: cargo prints each artifact as JSON; keep those with an executable.
    cargo test --release --no-run "${pkgargs[@]}" --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, os, shutil
dest = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        name = m["target"]["name"]
        pkg = m["package_id"].split("#")[0].rstrip("/").split("/")[-1]
        out = os.path.join(dest, f"{pkg}--{name}")
        shutil.copy2(m["executable"], out)
        print("test", out)
' "$BUNDLE/tests"
    for pe in $GPU_EXAMPLES; do
        local p=${pe%%:*} e=${pe##*:}
        cargo build --release -p "$p" --example "$e"
        cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/$e" "$BUNDLE/bin/"
        echo "example $BUNDLE/bin/$e"
    done
    for pb in $GPU_BINS; do
        local p=${pb%%:*} b=${pb##*:}
        cargo build --release -p "$p" --bin "$b"
        cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/$b" "$BUNDLE/bin/"
        echo "bin $BUNDLE/bin/$b"
    done
    # Line tables are kept for backtraces only here; the box needs no debug info (and the bundle
    # travels under a size limit).
    if command -v strip >/dev/null; then strip --strip-debug "$BUNDLE"/tests/* "$BUNDLE"/bin/*; fi
    { echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (dirty)')"; echo "built $(date -u +%FT%TZ)"; } > "$BUNDLE/MANIFEST"
    du -sh "$BUNDLE"
}

run() {
    : "${OUT:?run sets logs under \$OUT}"
    cd "$ROOT"
    local log="$OUT/device-check.log" status=0 need
    {
        echo "== $(cat "$BUNDLE/MANIFEST" | tr '\n' ' ')"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true
    } | tee "$log"
    export HIPFIRE_KERNEL_CACHE="${HIPFIRE_KERNEL_CACHE:-/tmp/hipfire-kernels}"
    # NVRTC lives here on the box; harmless where it does not exist.
    export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for t in "$BUNDLE"/tests/*; do
        echo "== test $(basename "$t")" | tee -a "$log"
        # The real-weights tests fail without their model files; leave them out, saying so.
        case "$(basename "$t")" in
        *--gpu_smollm2) need=HIPFIRE_SMOLLM2_GGUF ;;
        *--gpu_gemma3_slim) need=HIPFIRE_GEMMA3_SLIM_GGUF ;;
        *) need="" ;;
        esac
        if [ -n "$need" ] && [ -z "${!need:-}" ]; then
            echo "not run: $need is not set" | tee -a "$log"
            continue
        fi
        if ! "$t" --include-ignored --test-threads=1 --nocapture >>"$OUT/tests.log" 2>&1; then
            status=1
            echo "FAILED: $(basename "$t")" | tee -a "$log"
        fi
        grep -E "^test result" "$OUT/tests.log" | tail -1 | tee -a "$log"
    done
    local bin="$BUNDLE/bin"
    while IFS= read -r cmd; do
        [ -z "$cmd" ] && continue
        cmd=${cmd//\{bin\}/$bin}
        cmd=${cmd//\{out\}/$OUT}
        echo "== bench $cmd" | tee -a "$log"
        if ! bash -c "$cmd" >>"$OUT/bench.log" 2>&1; then
            status=1
            echo "FAILED: $cmd" | tee -a "$log"
        fi
    done <<<"$GPU_BENCHES"
    tail -n 60 "$OUT/bench.log" || true
    grep -E "FAILED|panicked" "$OUT/tests.log" | head -20 || true
    echo "== status $status" | tee -a "$log"
    return $status
}

case "${1:-}" in
build) build ;;
run) run ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
