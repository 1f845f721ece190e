#!/usr/bin/env python3
"""Batch invariance of an OpenAI-compatible server: greedy completions of N distinct prompts,
each sent alone, then all N at once; prints one JSON object with how many texts are equal and,
for each that is not, the first character where it departs.

    python3 scripts/serve_invariance.py --url http://127.0.0.1:8080 --concurrency 8

Standard library only, for the GPU box. On a model with clear argmaxes the texts are equal;
where two logits nearly tie, the different arithmetic of a batched step (rows split between
the engines, the GEMM instead of the GEMV) may pick the other token, which is why this reports
rather than asserts (CI's invariance test runs SmolLM2 on the CPU and asserts).
"""

import argparse
import http.client
import json
import threading
import urllib.parse


def complete(host, port, prompt, max_tokens):
    conn = http.client.HTTPConnection(host, port, timeout=300)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {data[:200]!r}")
    return json.loads(data)["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80
    prompts = [f"Story {i}: the {w} of the lighthouse keeper" for i, w in
               enumerate(["morning", "letter", "storm", "bottle", "ship", "lamp", "gull",
                          "tide", "rock", "map", "bell", "fog", "key", "rope", "star", "wave"])]
    prompts = prompts[: args.concurrency]
    alone = [complete(host, port, p, args.max_tokens) for p in prompts]
    together = [None] * len(prompts)
    errors = []

    def run(i):
        try:
            together[i] = complete(host, port, prompts[i], args.max_tokens)
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(f"{i}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    differ = []
    for i, (a, b) in enumerate(zip(alone, together)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b or "")) if x != y),
                      min(len(a), len(b or "")))
            differ.append({"prompt": i, "first_char": at, "alone_len": len(a)})
    print(json.dumps({"url": args.url, "requests": len(prompts), "equal": len(prompts) - len(differ),
                      "differ": differ, "errors": errors}))


if __name__ == "__main__":
    main()
