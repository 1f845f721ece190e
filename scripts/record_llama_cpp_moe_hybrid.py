#!/usr/bin/env python3
"""Record llama.cpp logits of random-weight Mixture-of-Experts files (qwen3moe, qwen2moe with
its gated shared expert, Mixtral-style llama with experts, glm4moe with sigmoid routing, a
selection bias, a dense first layer and a NextN block, gpt-oss with sinks, biases, alternating
sliding-window layers and YaRN), Qwen3.5 hybrids (qwen35, qwen35moe: Gated DeltaNet + gated
attention; qwen35moe also with a fused ffn_gate_up_exps) and Qwen3-Next hybrids (qwen3next:
fused ssm_ba, grouped value heads; also with the older fused ssm_in) into a small JSON fixture,
for hipfire-model's `moe_hybrid_llamacpp` test.

Usage:
    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source
    cargo build --release -p hipfire-cli
    python3 scripts/record_llama_cpp_moe_hybrid.py --hipfire target/release/hipfire \\
        [--out tests/fixtures/moe_hybrid_llamacpp.json] [--only NAME ...]

`--only` records the named cases and keeps the others as the fixture already has them.

Each case is a file written by `hipfire synth` with the flags stored in the fixture, and its
SHA-256, so the test can prove it regenerated the same bytes. A fixed prompt of random token
ids is evaluated in one batch; the fixture keeps the argmax at every position and the whole
logit row at a few positions. Settings as scripts/record_llama_cpp_rope.py: CPU, one thread,
no flash attention, f32 KV cache.
"""
import argparse

from llama_cpp_synth_record import record

PROMPT_LEN = 64  # positions evaluated (the tiny presets' context is 256)
LOGIT_POSITIONS = [0, 5, 31, 63]  # positions whose whole logit row is kept
SEED = 1  # synth seed
PROMPT_SEED = 0
VOCAB = 512  # tiny presets
# (name, synth --arch, --format). f32 files isolate the routing, recurrence and expert
# arithmetic; the q8_0 files check quantised weights (llama.cpp quantises the activations to
# q8_0 as hipfire does).
CASES = [
    ("qwen3moe-f32", "tiny-qwen3moe", "f32"),
    ("qwen2moe-f32", "tiny-qwen2moe", "f32"),
    ("mixtral-f32", "tiny-mixtral", "f32"),
    ("qwen3moe-q8_0", "tiny-qwen3moe", "q8_0"),
    ("qwen35-f32", "tiny-qwen35", "f32"),
    ("qwen35moe-f32", "tiny-qwen35moe", "f32"),
    ("qwen35-q8_0", "tiny-qwen35", "q8_0"),
    ("qwen35moe-gate-up-f32", "tiny-qwen35moe-gate-up", "f32"),
    ("qwen3next-f32", "tiny-qwen3next", "f32"),
    ("qwen3next-ssm-in-f32", "tiny-qwen3next-ssm-in", "f32"),
    ("qwen3next-q8_0", "tiny-qwen3next", "q8_0"),
    ("glm4moe-f32", "tiny-glm4moe", "f32"),
    ("glm4moe-q8_0", "tiny-glm4moe", "q8_0"),
    # gpt-oss: f32, and MXFP4 as its experts ship (llama.cpp quantises the activations to q8_0
    # for MXFP4 weights as hipfire does).
    ("gpt-oss-f32", "tiny-gpt-oss", "f32"),
    ("gpt-oss-mxfp4", "tiny-gpt-oss", "mxfp4"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hipfire", required=True, help="hipfire binary (for `synth`)")
    ap.add_argument("--out", default="tests/fixtures/moe_hybrid_llamacpp.json")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="record these cases, keep the others")
    a = ap.parse_args()
    cases = [(name, ["--arch", arch, "--format", fmt, "--seed", str(SEED)]) for name, arch, fmt in CASES]
    record(a.hipfire, cases, PROMPT_LEN, LOGIT_POSITIONS, PROMPT_SEED, VOCAB, a.out, {}, a.only)


if __name__ == "__main__":
    main()
