#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (`hipfire serve`, llama-server, ...).

N client threads each send streaming completions back to back for a fixed time (or a fixed
number of requests) and time every token as it arrives. Prints one JSON object: aggregate
generated tokens per second over the run's wall time, requests, errors, and p50/p99 of
time-to-first-token and inter-token latency (client-side, so it includes HTTP and SSE costs).

    python3 scripts/serve_load.py --url http://127.0.0.1:8080 --concurrency 4 --seconds 30

Uses only the standard library (http.client), so the client costs little CPU next to the server
on a small box. Every request is greedy with the same prompt, `ignore_eos` (hipfire,
llama-server) and, with --ban-tokens, a -100 logit bias on the end-of-generation ids (for servers
without ignore_eos, such as llama-cpp-python's), so every server generates exactly
`--max-tokens` per request.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[i]


def one_request(host, port, args, headers):
    """One streaming request: (generated tokens, ttft s, [inter-token s], error or None)."""
    body = {
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # llama-server: do not stop early, so every server generates max_tokens.
        "ignore_eos": True,
    }
    if args.model:
        body["model"] = args.model
    if args.ban_tokens:
        # Servers without ignore_eos (llama-cpp-python) honour a -100 bias on the EOG ids.
        body["logit_bias"] = {t: -100 for t in args.ban_tokens.split(",")}
    t0 = time.monotonic()
    try:
        conn = http.client.HTTPConnection(host, port, timeout=300)
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return 0, None, [], f"status {resp.status}: {resp.read()[:200]!r}"
        ttft, gaps, last, chunks, usage, done = None, [], None, 0, None, False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
            if not any(c.get("text") for c in ev.get("choices") or []):
                continue
            now = time.monotonic()
            if ttft is None:
                ttft = now - t0
            else:
                gaps.append(now - last)
            last = now
            chunks += 1
        conn.close()
        if not done:
            # A stream the server cut off (llama-cpp-python's under concurrency) is an error.
            return chunks, ttft, gaps, f"stream ended without [DONE] after {chunks} chunks"
        return (usage if usage is not None else chunks), ttft, gaps, None
    except Exception as e:  # noqa: BLE001 - counted as an error
        return 0, None, [], f"{type(e).__name__}: {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=30.0, help="run time (0: use --requests)")
    ap.add_argument("--requests", type=int, default=0, help="requests in all (with --seconds 0)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--label", default="", help="copied into the output")
    ap.add_argument("--ban-tokens", default="",
                    help="comma-separated token ids sent with logit_bias -100 (SmolLM2's EOG: 0,2)")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"

    lock = threading.Lock()
    results = []
    issued = [0]
    t_start = time.monotonic()
    deadline = t_start + args.seconds if args.seconds > 0 else None

    def worker():
        while True:
            with lock:
                if deadline is None:
                    if issued[0] >= args.requests:
                        return
                elif time.monotonic() >= deadline:
                    return
                issued[0] += 1
            r = one_request(host, port, args, headers)
            with lock:
                results.append((time.monotonic(), r))

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t_start
    tokens = sum(r[0] for _, r in results)
    errors = [r[3] for _, r in results if r[3]]
    ttfts = [r[1] for _, r in results if r[1] is not None]
    gaps = [g for _, r in results for g in r[2]]
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    out = {
        "label": args.label,
        "url": args.url,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "requests": len(results),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": round(wall, 3),
        "generated_tokens": tokens,
        "aggregate_tok_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "ttft_ms_p50": ms(percentile(ttfts, 50)),
        "ttft_ms_p99": ms(percentile(ttfts, 99)),
        "itl_ms_p50": ms(percentile(gaps, 50)),
        "itl_ms_p99": ms(percentile(gaps, 99)),
        "itl_ms_mean": ms(statistics.fmean(gaps)) if gaps else None,
    }
    print(json.dumps(out))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
