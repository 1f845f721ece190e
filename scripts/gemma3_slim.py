#!/usr/bin/env python3
"""A slim copy of a real Gemma 3 GGUF, small enough to travel to the GPU box (the device tool
carries at most 64 MiB; Gemma-3-270M Q4_K_M is 253 MB, 178 MB of it the Q8_0 embedding):
its first LAYERS blocks and first VOCAB tokens, every kept tensor's bytes unchanged (the
file's own Q5_0 / Q8_0 / Q4_K / Q6_K mix and scales), the metadata told so (block count,
tokenizer arrays cut to VOCAB).

    python3 scripts/gemma3_slim.py "$(scripts/gemma3-path.sh)" /tmp/gemma3-slim.gguf [--layers 6] [--vocab 8192]

The model it makes is not Gemma-3-270M (fewer layers, a cut vocabulary): the GPU tier checks the
GPU decoder against the CPU engine on it (crates/hipfire-model/tests/gpu_gemma3_slim.rs), and
the CPU engine is checked against llama.cpp on the whole file (tests/gemma3.rs). Keep LAYERS at
least 6 so that a global layer (every sixth) is among the sliding-window ones.
"""

import argparse
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

# Metadata the writer sets itself.
SKIP_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
# Tokenizer arrays with one entry per token.
PER_TOKEN_KEYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    r = GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    if arch != "gemma3":
        sys.exit(f"{a.src}: architecture {arch!r}, want gemma3")
    n_layer = r.fields[f"{arch}.block_count"].contents()
    vocab = len(r.fields["tokenizer.ggml.tokens"].contents())
    if not 1 <= a.layers <= n_layer or not 1 <= a.vocab <= vocab:
        sys.exit(f"--layers 1..{n_layer} and --vocab 1..{vocab}")
    w = GGUFWriter(a.dst, arch)
    for key, f in r.fields.items():
        if key in SKIP_KEYS or key == "general.architecture":
            continue
        val = f.contents()
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        if key == f"{arch}.block_count":
            val = a.layers
        elif key in PER_TOKEN_KEYS:
            val = val[: a.vocab]
        elif key == "tokenizer.ggml.merges":
            # BPE merges name tokens by text; a cut vocabulary keeps the ones it can still form.
            pass
        w.add_key_value(key, val, vtype, sub)
    kept = 0
    for t in r.tensors:
        name = t.name
        if name.startswith("blk.") and int(name.split(".")[1]) >= a.layers:
            continue
        # Row-major, one row per output (bytes per row for a quantised type): the writer
        # derives the element shape from it.
        data = np.asarray(t.data)
        if name == "token_embd.weight":
            data = data[: a.vocab]
        w.add_tensor(name, data, raw_dtype=t.tensor_type)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.dst}: {a.layers} of {n_layer} layers, {a.vocab} of {vocab} tokens, {kept} tensors")


if __name__ == "__main__":
    main()
