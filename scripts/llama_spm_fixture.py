#!/usr/bin/env python3
"""Build a tiny SentencePiece-style (tokenizer.ggml.model = "llama") vocabulary-only GGUF and
record llama.cpp's tokenization of fixed strings with it, for hipfire's SPM tokenizer test.

    python3 scripts/llama_spm_fixture.py   # writes tests/fixtures/spm_vocab.gguf + spm_tokenize.json

The vocabulary is hand-made (no SPM model ships with the CI wheel): <unk>, <s>, </s>, the 256
<0xXX> byte pieces, single characters and a few merged pieces whose scores rank the merges.
"""
import json

import gguf
from llama_cpp import Llama, __version__

GGUF_OUT = "tests/fixtures/spm_vocab.gguf"
JSON_OUT = "tests/fixtures/spm_tokenize.json"
SP = "\u2581"
PIECES = [  # (piece, score): higher score merges first, as SentencePiece log-probs
    (SP + "the", -1.0), (SP + "t", -2.0), ("he", -2.5), ("th", -3.0), (SP + "a", -3.5),
    ("er", -4.0), ("at", -4.2), ("ll", -4.5), ("llo", -4.6), (SP + "he", -4.8), (SP + "hello", -5.0),
    ("ell", -5.5), ("el", -6.0), ("or", -6.2), ("ld", -6.4), (SP + "w", -6.6), (SP + "wor", -6.8),
    ("wor", -7.0), (SP + "world", -7.2), ("in", -7.4), ("ing", -7.6), (SP + "s", -7.8), ("ea", -8.0),
    ("ter", -8.2), ("ate", -8.4), (SP + SP, -8.6),
]
CHARS = "abcdefghijklmnopqrstuvwxyzHW" + SP + ".,!?é"
STRINGS = [
    "Hello world",
    "the theater",
    " leading space",
    "hello  there, world!",
    "ünï ✓ é",
    "eating heating",
    "",
]


def main():
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>"); scores.append(0.0); types.append(6)
    for i, c in enumerate(CHARS):
        tokens.append(c); scores.append(-20.0 - i * 0.01); types.append(1)
    for p, s in PIECES:
        tokens.append(p); scores.append(s); types.append(1)
    w = gguf.GGUFWriter(GGUF_OUT, "llama")
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    llm = Llama(model_path=GGUF_OUT, vocab_only=True, verbose=False)
    out = {"llama_cpp_python": __version__, "cases": [
        {"text": t, "ids": llm.tokenize(t.encode(), add_bos=True, special=True)} for t in STRINGS]}
    with open(JSON_OUT, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    for c in out["cases"]:
        print(repr(c["text"]), [tokens[i] for i in c["ids"]])


if __name__ == "__main__":
    main()
