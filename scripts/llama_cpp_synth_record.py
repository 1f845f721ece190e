"""What the llama.cpp recorders of synthetic files share (scripts/record_llama_cpp_rope.py,
scripts/record_llama_cpp_moe_hybrid.py): write each case with `hipfire synth`, evaluate a fixed
random prompt in one batch with llama-cpp-python (CPU, one thread, no flash attention, f32 KV
cache), and keep the argmax at every position and whole logit rows at a few positions, with the
file's SHA-256 so a test can prove it regenerated the same bytes."""
import hashlib
import json
import os
import subprocess
import tempfile

import numpy as np

from record_llama_cpp import reference_llama

N_CTX = 256  # the tiny presets' context


def record(hipfire, cases, prompt_len, logit_positions, prompt_seed, vocab, out, settings, only=None):
    """`cases`: (name, synth flags). Writes the fixture to `out`. With `only` (case names), records
    just those and keeps the other cases as `out` already holds them (same prompt and llama.cpp
    version required), so adding a case leaves the recorded values of the others untouched."""
    import llama_cpp

    prompt = [int(x) for x in np.random.default_rng(prompt_seed).integers(2, vocab, prompt_len)]
    kept = {}
    if only:
        unknown = set(only) - {name for name, _ in cases}
        if unknown:
            raise SystemExit(f"unknown cases: {sorted(unknown)}")
        old = json.load(open(out))
        if old["prompt_ids"] != prompt or old["llama_cpp_python"] != llama_cpp.__version__:
            raise SystemExit(f"{out} was recorded with another prompt or llama-cpp-python; record every case")
        kept = {c["name"]: c for c in old["cases"]}
    recorded = {}
    with tempfile.TemporaryDirectory() as d:
        for name, flags in cases:
            if only and name not in only:
                continue
            path = os.path.join(d, name + ".gguf")
            subprocess.run([hipfire, "synth", *flags, "--out", path], check=True, capture_output=True)
            sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
            llm = reference_llama(path, N_CTX)
            llm.eval(prompt)
            scores = np.array(llm.scores[:prompt_len], dtype=np.float64)
            recorded[name] = {
                "name": name,
                "synth_flags": flags,
                "sha256": sha,
                "argmax": [int(i) for i in scores.argmax(axis=1)],
                "logits": {str(p): [round(float(v), 6) for v in scores[p]] for p in logit_positions},
            }
            del llm
            print(name, "logit range at last position", float(np.ptp(scores[-1])))
    rows = [recorded[name] if name in recorded else kept[name] for name, _ in cases]
    fixture = {
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {"n_threads": 1, "n_batch": N_CTX, "flash_attn": False, "kv_cache": "f32", **settings},
        "prompt_ids": prompt,
        "cases": rows,
    }
    with open(out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
    print("wrote", out, os.path.getsize(out), "bytes")
