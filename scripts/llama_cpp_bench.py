#!/usr/bin/env python3
"""Decode tok/s: hipfire's CPU path vs llama-cpp-python, same GGUF, threads, prompt and token
count, rounds interleaved in one run.

    cargo build --release -p hipfire-model --example decode_bench
    python3 scripts/llama_cpp_bench.py --hipfire-bin target/release/examples/decode_bench \\
        [--gguf PATH] [--threads 2] [--tokens 64] [--rounds 3]

Both sides: greedy, EOG ignored, prefill excluded; the figure is decode forward passes per
second after the prompt (llama.cpp: n_batch covers the prompt, logits of the last position only).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from record_llama_cpp import find_gguf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hipfire-bin", required=True)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--prompt-repeat", type=int, default=1,
                    help="repeat --prompt this many times (long-context runs)")
    ap.add_argument("--ctx", type=int, default=512,
                    help="both engines' context length, and llama.cpp's n_batch (prompt + tokens must fit)")
    a = ap.parse_args()
    path = a.gguf or find_gguf()

    from llama_cpp import Llama, __version__

    a.prompt = a.prompt * a.prompt_repeat
    llm = Llama(model_path=path, n_ctx=a.ctx, n_batch=a.ctx, n_threads=a.threads,
                n_threads_batch=a.threads, verbose=False, seed=0)
    ids = llm.tokenize(a.prompt.encode(), add_bos=True, special=True)

    def llama_round():
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(a.tokens):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([tok])
        t2 = time.perf_counter()
        return {"engine": "llama.cpp", "prefill_s": t1 - t0, "decode_s": t2 - t1,
                "decode_tok_s": a.tokens / (t2 - t1)}

    def hipfire_round():
        out = subprocess.run([a.hipfire_bin, path, str(a.threads), str(a.tokens), "1", a.prompt, str(a.ctx)],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    res = {"hipfire-cpu": [], "llama.cpp": []}
    llama_round()  # warm-up (page cache, thread pool)
    for r in range(a.rounds):
        for name, fn in (("hipfire-cpu", hipfire_round), ("llama.cpp", llama_round)):
            x = fn()
            res[name].append(x["decode_tok_s"])
            print(f"round {r} {name}: {x['decode_tok_s']:.1f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(json.dumps({"gguf": path.rsplit('/', 1)[-1], "threads": a.threads, "tokens": a.tokens,
                      "prompt_tokens": len(ids), "llama_cpp_python": __version__, "median_tok_s": med,
                      "ratio_hipfire_over_llama": med["hipfire-cpu"] / med["llama.cpp"], "rounds": res}))


if __name__ == "__main__":
    main()
