#!/usr/bin/env bash
# Gemma-3-270M Q4_K_M CPU decode, hipfire vs llama-cpp-python, THREADS (default 2) threads,
# ROUNDS (default 5) rounds interleaved, 64 tokens after a 6-token prompt.
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release -p hipfire-model --example decode_bench
G="$(scripts/gemma3-path.sh)"
uptime
python3 scripts/llama_cpp_bench.py --hipfire-bin target/release/examples/decode_bench \
    --gguf "$G" --threads "${THREADS:-2}" --tokens 64 --rounds "${ROUNDS:-5}"
uptime
