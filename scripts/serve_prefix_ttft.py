#!/usr/bin/env python3
"""Time to first token of a second chat turn: prefix reused vs the same conversation cold.

Per repetition: start `hipfire serve` (one slot), send turn 1 (a long user message), then turn 2
(turn 1, its answer, a short new message) and time its first token (reuse); then start a fresh
server and send the same turn 2 (cold: the whole conversation prefilled). Prints one JSON object
with every request's client-side TTFT and the server's `usage` (prompt tokens and
`prompt_tokens_details.cached_tokens`).

    python3 scripts/serve_prefix_ttft.py --hipfire target/release/hipfire --model m.gguf \\
        --turn1-words 1500 --reps 3 --out raw.json -- --threads 2 --ctx-size 8192

Uses only the standard library. Arguments after `--` go to `hipfire serve`.
"""

import argparse
import http.client
import json
import subprocess
import sys
import time

# A user message of many distinct words; the synthetic tokenizer splits each into a few tokens.
FILLER = "lighthouse keeper bottle message harbour storm lantern gull tide rope"
# Turn 2's new message: short, so reuse leaves only it to prefill.
TURN2 = "Thanks. Now summarise that in one sentence, please."
# Seconds to wait for a started server's /health.
START_TIMEOUT_S = 120
# Seconds one request may take (a cold prefill of thousands of tokens on 2 cores is minutes).
REQUEST_TIMEOUT_S = 3600


def long_message(words):
    base = FILLER.split()
    return " ".join(f"{base[i % len(base)]}{i}" for i in range(words))


def start(args):
    cmd = [args.hipfire, "serve", args.model, "--port", str(args.port), "--parallel", "1"]
    proc = subprocess.Popen(cmd + args.serve_args, stdout=subprocess.DEVNULL)
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    sys.exit("server did not become healthy")


def stop(proc):
    proc.terminate()
    proc.wait(timeout=60)


def chat(args, messages):
    """One streaming chat request: answer text, TTFT s, total s, usage."""
    body = {
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=REQUEST_TIMEOUT_S)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:500]!r}")
    text, ttft, usage = "", None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
    return text, ttft, time.perf_counter() - t0, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hipfire", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=18093)
    ap.add_argument("--turn1-words", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("serve_args", nargs="*")
    args = ap.parse_args()
    user1 = {"role": "user", "content": long_message(args.turn1_words)}
    rows = []
    for rep in range(args.reps):
        proc = start(args)
        try:
            answer, ttft1, total1, usage1 = chat(args, [user1])
            turn2 = [user1, {"role": "assistant", "content": answer},
                     {"role": "user", "content": TURN2}]
            _, ttft2, total2, usage2 = chat(args, turn2)
        finally:
            stop(proc)
        proc = start(args)
        try:
            _, ttft_cold, total_cold, usage_cold = chat(args, turn2)
        finally:
            stop(proc)
        row = {
            "rep": rep,
            "turn1": {"ttft_s": ttft1, "total_s": total1, "usage": usage1},
            "turn2_reuse": {"ttft_s": ttft2, "total_s": total2, "usage": usage2},
            "turn2_cold": {"ttft_s": ttft_cold, "total_s": total_cold, "usage": usage_cold},
        }
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    out = {"model": args.model, "serve_args": args.serve_args, "max_tokens": args.max_tokens,
           "turn1_words": args.turn1_words, "rows": rows}
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
