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
    """`cases`: (name, synth flags). Writes the fixture to `out`. With `only` (case names), only
    those cases are recorded and merged into the fixture already at `out`, whose other cases
    keep their recorded values (the prompt and llama-cpp-python version must be the same)."""
    import llama_cpp

    prompt = [int(x) for x in np.random.default_rng(prompt_seed).integers(2, vocab, prompt_len)]
    old = None
    if only:
        unknown = set(only) - {name for name, _ in cases}
        assert not unknown, f"no such case: {sorted(unknown)}"
        with open(out) as f:
            old = json.load(f)
        assert old["prompt_ids"] == prompt, "the fixture was recorded with another prompt"
        assert old["llama_cpp_python"] == llama_cpp.__version__, "another llama-cpp-python"
        cases = [(name, flags) for name, flags in cases if name in only]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, flags in cases:
            path = os.path.join(d, name + ".gguf")
            subprocess.run([hipfire, "synth", *flags, "--out", path], check=True, capture_output=True)
            sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
            llm = reference_llama(path, N_CTX)
            llm.eval(prompt)
            scores = np.array(llm.scores[:prompt_len], dtype=np.float64)
            rows.append(
                {
                    "name": name,
                    "synth_flags": flags,
                    "sha256": sha,
                    "argmax": [int(i) for i in scores.argmax(axis=1)],
                    "logits": {str(p): [round(float(v), 6) for v in scores[p]] for p in logit_positions},
                }
            )
            del llm
            print(name, "logit range at last position", float(np.ptp(scores[-1])))
    if old is not None:
        # Replace the re-recorded cases in place; append the new ones in `cases` order.
        fresh = {r["name"]: r for r in rows}
        kept = [fresh.pop(r["name"], r) for r in old["cases"]]
        rows = kept + [r for r in rows if r["name"] in fresh]
    fixture = {
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {"n_threads": 1, "n_batch": N_CTX, "flash_attn": False, "kv_cache": "f32", **settings},
        "prompt_ids": prompt,
        "cases": rows,
    }
    with open(out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
    print("wrote", out, os.path.getsize(out), "bytes")
