#!/usr/bin/env python3
"""Record llama.cpp logits of random-weight Mixture-of-Experts files (qwen3moe, qwen2moe with
its gated shared expert, Mixtral-style llama with experts) into a small JSON fixture, for
hipfire-model's `moe_llamacpp` test.

Usage:
    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source
    cargo build --release -p hipfire-cli
    python3 scripts/record_llama_cpp_moe.py --hipfire target/release/hipfire \\
        [--out tests/fixtures/moe_llamacpp.json]

Each case is a file written by `hipfire synth` with the flags stored in the fixture, and its
SHA-256, so the test can prove it regenerated the same bytes. A fixed prompt of random token
ids is evaluated in one batch; the fixture keeps the argmax at every position and the whole
logit row at a few positions. Settings as scripts/record_llama_cpp_rope.py: CPU, one thread,
no flash attention, f32 KV cache.
"""
import argparse
import hashlib
import json
import os
import subprocess
import tempfile

import numpy as np

PROMPT_LEN = 64  # positions evaluated (the tiny presets' context is 256)
LOGIT_POSITIONS = [0, 5, 31, 63]  # positions whose whole logit row is kept
SEED = 1  # synth seed
PROMPT_SEED = 0
GGML_TYPE_F32 = 0
# (name, synth --arch, --format). f32 files isolate the routing and expert arithmetic; the q8_0
# file checks quantised experts (llama.cpp quantises the activations to q8_0 as hipfire does).
CASES = [
    ("qwen3moe-f32", "tiny-qwen3moe", "f32"),
    ("qwen2moe-f32", "tiny-qwen2moe", "f32"),
    ("mixtral-f32", "tiny-mixtral", "f32"),
    ("qwen3moe-q8_0", "tiny-qwen3moe", "q8_0"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hipfire", required=True, help="hipfire binary (for `synth`)")
    ap.add_argument("--out", default="tests/fixtures/moe_llamacpp.json")
    a = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    vocab = 512  # tiny presets
    prompt = [int(x) for x in np.random.default_rng(PROMPT_SEED).integers(2, vocab, PROMPT_LEN)]
    cases = []
    with tempfile.TemporaryDirectory() as d:
        for name, arch, fmt in CASES:
            path = os.path.join(d, name + ".gguf")
            flags = ["--arch", arch, "--format", fmt, "--seed", str(SEED)]
            subprocess.run([a.hipfire, "synth", *flags, "--out", path], check=True, capture_output=True)
            sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
            llm = Llama(
                model_path=path,
                n_ctx=256,
                n_batch=256,
                n_ubatch=256,
                n_threads=1,
                n_threads_batch=1,
                logits_all=True,
                verbose=False,
                seed=0,
                flash_attn=False,
                type_k=GGML_TYPE_F32,
                type_v=GGML_TYPE_F32,
            )
            llm.eval(prompt)
            scores = np.array(llm.scores[:PROMPT_LEN], dtype=np.float64)
            cases.append(
                {
                    "name": name,
                    "synth_flags": flags,
                    "sha256": sha,
                    "argmax": [int(i) for i in scores.argmax(axis=1)],
                    "logits": {str(p): [round(float(v), 6) for v in scores[p]] for p in LOGIT_POSITIONS},
                }
            )
            del llm
            print(name, "logit range at last position", float(np.ptp(scores[-1])))
    out = {
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {"n_threads": 1, "n_batch": 256, "flash_attn": False, "kv_cache": "f32"},
        "prompt_ids": prompt,
        "cases": cases,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", a.out, os.path.getsize(a.out), "bytes")


if __name__ == "__main__":
    main()
