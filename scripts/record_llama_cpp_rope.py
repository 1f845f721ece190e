#!/usr/bin/env python3
"""Record llama.cpp logits of random-weight llama / qwen2 files with scaled RoPE (linear x4,
YaRN x4) into a small JSON fixture, for hipfire-model's `rope_scaling_llamacpp` test.

Usage:
    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source
    cargo build --release -p hipfire-cli
    python3 scripts/record_llama_cpp_rope.py --hipfire target/release/hipfire \\
        [--out tests/fixtures/rope_scaling_llamacpp.json]

Each case is a file written by `hipfire synth` (f32 weights, so both sides multiply exactly and
the comparison sees RoPE, not activation quantisation) with the flags stored in the fixture; its
SHA-256 is stored too, so the test can prove it regenerated the same bytes. A fixed prompt of
random token ids is evaluated in one batch; the fixture keeps the argmax at every position and
the whole logit row at a few positions. Settings as scripts/record_llama_cpp.py: CPU, one
thread, no flash attention, f32 KV cache (exact attention).
"""
import argparse

from llama_cpp_synth_record import record

PROMPT_LEN = 200  # positions evaluated (the tiny presets' context is 256)
LOGIT_POSITIONS = [0, 17, 63, 127, 199]  # positions whose whole logit row is kept
SEED = 1  # synth seed
PROMPT_SEED = 0
# (name, synth --arch, extra synth flags). Unscaled files are recorded too: the test checks
# that the scaled references differ from them by far more than its bound (the test can fail).
CASES = [
    ("llama-none", "tiny", []),
    ("llama-linear4", "tiny", ["--rope-scaling", "linear", "--rope-scaling-factor", "4"]),
    ("llama-yarn4", "tiny", ["--rope-scaling", "yarn", "--rope-scaling-factor", "4", "--rope-original-ctx", "64"]),
    ("qwen2-none", "tiny-qwen2", []),
    ("qwen2-linear4", "tiny-qwen2", ["--rope-scaling", "linear", "--rope-scaling-factor", "4"]),
    ("qwen2-yarn4", "tiny-qwen2", ["--rope-scaling", "yarn", "--rope-scaling-factor", "4", "--rope-original-ctx", "64"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hipfire", required=True, help="hipfire binary (for `synth`)")
    ap.add_argument("--out", default="tests/fixtures/rope_scaling_llamacpp.json")
    a = ap.parse_args()
    cases = [
        (name, ["--arch", arch, "--format", "f32", "--seed", str(SEED)] + extra)
        for name, arch, extra in CASES
    ]
    record(a.hipfire, cases, PROMPT_LEN, LOGIT_POSITIONS, PROMPT_SEED, 512, a.out, {"weights": "f32"})


if __name__ == "__main__":
    main()
