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
import hashlib
import json
import os
import subprocess
import tempfile

import numpy as np

PROMPT_LEN = 200  # positions evaluated (the tiny presets' context is 256)
LOGIT_POSITIONS = [0, 17, 63, 127, 199]  # positions whose whole logit row is kept
SEED = 1  # synth seed
PROMPT_SEED = 0
GGML_TYPE_F32 = 0
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

    import llama_cpp
    from llama_cpp import Llama

    vocab = 512  # tiny presets
    prompt = [int(x) for x in np.random.default_rng(PROMPT_SEED).integers(2, vocab, PROMPT_LEN)]
    cases = []
    with tempfile.TemporaryDirectory() as d:
        for name, arch, extra in CASES:
            path = os.path.join(d, name + ".gguf")
            flags = ["--arch", arch, "--format", "f32", "--seed", str(SEED)] + extra
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
        "settings": {"n_threads": 1, "n_batch": 256, "flash_attn": False, "kv_cache": "f32", "weights": "f32"},
        "prompt_ids": prompt,
        "cases": cases,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", a.out, os.path.getsize(a.out), "bytes")


if __name__ == "__main__":
    main()
