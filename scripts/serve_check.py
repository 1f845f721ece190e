#!/usr/bin/env python3
"""End-to-end checks of `hipfire serve` with the official `openai` Python client.

Driven by crates/hipfire-cli/tests/serve.rs (which passes the built binary and the SmolLM2
GGUF); runnable alone:

    python3 scripts/serve_check.py --hipfire target/debug/hipfire --model "$HIPFIRE_SMOLLM2_GGUF"

Checks, in order, against live servers on free ports:
  1. chat and completion, streaming and not, through `openai` (usage counts, finish reasons,
     streamed text == whole text for greedy, the repeated prompt's reuse in
     `usage.prompt_tokens_details.cached_tokens`), /v1/models, /health, /metrics, the API key;
  2. batch invariance: 16 concurrent greedy requests give the text each gives alone, and the
     server really batched them (its batch-size histogram saw steps of more than one);
  3. bad requests (malformed JSON, wrong-typed fields, prompt over the context, max_tokens <= 0,
     unknown route) -> 4xx in OpenAI's error shape, and the server keeps serving;
  4. a bounded load run (200 requests at concurrency 16) with zero errors and stable RSS;
  5. on a one-slot server: 429 + Retry-After when full, a disconnect frees the slot, and
     SIGTERM mid-stream finishes the stream and exits 0.
Exits non-zero with a message on the first failure.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

API_KEY = "test-key"
# Greedy generations compared for batch invariance: long enough to diverge if batching changed
# a logit, short enough for a loaded 2-core box.
INVARIANCE_TOKENS = 24
INVARIANCE_REQUESTS = 16
LOAD_REQUESTS = 200
LOAD_CONCURRENCY = 16
LOAD_MAX_TOKENS = 8
# RSS may grow this much over the load run after its warm-up quarter (allocator noise; a leak
# of a KV cache or a request per iteration would exceed it many times over).
RSS_GROWTH_LIMIT_MIB = 24
# Context of the test servers: small, so an over-long prompt is cheap to build.
CTX = 512
STARTUP_TIMEOUT_S = 60
PROMPTS = [
    "Name a colour.",
    "What is 2 + 2?",
    "Say hello in French.",
    "Write one word about the sea.",
    "What is the capital of Italy?",
    "Give me a fruit.",
    "Count from one to five.",
    "What day comes after Monday?",
    "Name a planet.",
    "What is the opposite of hot?",
    "Name an animal that can fly.",
    "What is water made of?",
    "Tell me a number bigger than ten.",
    "What colour is grass?",
    "Name a musical instrument.",
    "What do bees make?",
]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Server:
    """A `hipfire serve` child on a free port, with a private config and data directory."""

    def __init__(self, hipfire, model, *extra):
        self.scratch = tempfile.mkdtemp(prefix="hipfire-serve-check-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HIPFIRE_")}
        env["HIPFIRE_CONFIG"] = os.path.join(self.scratch, "config.toml")
        env["HIPFIRE_HOME"] = os.path.join(self.scratch, "home")
        args = [hipfire, "serve", model, "--port", "0", "--ctx-size", str(CTX), "--threads", "2"]
        self.proc = subprocess.Popen(
            args + list(extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.stderr_lines = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        line = self._first_line()
        m = re.match(r"listening on http://([\d.]+):(\d+)", line)
        check(m, f"server did not print its address: {line!r}; stderr: {self.stderr()}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.base = f"http://{self.host}:{self.port}"

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _first_line(self):
        out = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(STARTUP_TIMEOUT_S)
        if not out:
            self.proc.kill()
            fail(f"server did not start within {STARTUP_TIMEOUT_S}s; stderr: {self.stderr()}")
        return out[0].strip()

    def stderr(self):
        return "".join(self.stderr_lines[-30:])

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def raw(self, method, path, body=None, headers=None):
        """One request with http.client: (status, headers, parsed JSON or text)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        h = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
        h.update(headers or {})
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(text)
        except json.JSONDecodeError:
            return r.status, dict(r.getheaders()), text

    def client(self, key=API_KEY):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=120)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"server did not exit within {timeout}s of signal {sig}")
        shutil.rmtree(self.scratch, ignore_errors=True)
        return rc


def metric(text, name):
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def chat(client, prompt, n, stream=False, **kw):
    msgs = [{"role": "user", "content": prompt}]
    if not stream:
        r = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=n, temperature=0, **kw
        )
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    s = client.chat.completions.create(
        model="m",
        messages=msgs,
        max_tokens=n,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **kw,
    )
    text, finish, usage = "", None, None
    for ch in s:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish, usage


def check_api(srv):
    c = srv.client()
    text, finish, usage = chat(c, "What is the capital of France?", 16)
    check(len(text.strip()) > 0, "chat returned no text")
    check(finish in ("stop", "length"), f"chat finish_reason {finish}")
    check(usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 16, f"chat usage {usage}")
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, "usage total")
    stext, sfinish, susage = chat(c, "What is the capital of France?", 16, stream=True)
    check(stext == text, f"streamed chat {stext!r} != whole {text!r}")
    def counts(u):
        return u.prompt_tokens, u.completion_tokens, u.total_tokens

    check(sfinish == finish and counts(susage) == counts(usage),
          f"stream finish/usage {sfinish} {susage}")
    # The repeat went to the slot holding the first request and reused all of its prompt but
    # the last token, which is fed again for its logits (an attention-only model, as SmolLM2).
    cached = susage.prompt_tokens_details.cached_tokens
    check(cached == usage.prompt_tokens - 1,
          f"repeat reused {cached} of {usage.prompt_tokens} prompt tokens")

    r = c.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0)
    ctext = r.choices[0].text
    check(r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length",
          f"completion usage {r.usage} finish {r.choices[0].finish_reason}")
    pieces = c.completions.create(
        model="m", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    stext = "".join(p.choices[0].text for p in pieces if p.choices)
    check(stext == ctext, f"streamed completion {stext!r} != whole {ctext!r}")

    # Stop strings: cut before the match, finish_reason stop.
    first_word = ctext.strip().split()[0] if ctext.strip() else None
    if first_word and len(ctext.strip().split()) > 1:
        r = c.completions.create(model="m", prompt="The capital of France is", max_tokens=8,
                                 temperature=0, stop=[first_word])
        check(first_word not in r.choices[0].text and r.choices[0].finish_reason == "stop",
              f"stop {first_word!r}: {r.choices[0].text!r} {r.choices[0].finish_reason}")
    # Seeded sampling is reproducible.
    a = c.completions.create(model="m", prompt="Once upon a time", max_tokens=12,
                             temperature=0.9, top_p=0.95, seed=7)
    b = c.completions.create(model="m", prompt="Once upon a time", max_tokens=12,
                             temperature=0.9, top_p=0.95, seed=7, extra_body={"top_k": 40})
    a2 = c.completions.create(model="m", prompt="Once upon a time", max_tokens=12,
                              temperature=0.9, top_p=0.95, seed=7)
    check(a.choices[0].text == a2.choices[0].text, "same seed, different text")
    check(b.usage.completion_tokens >= 1, "top_k request")

    models = c.models.list()
    check(len(models.data) == 1 and models.data[0].id, f"models {models}")
    st, _, body = srv.raw("GET", "/health")
    check(st == 200 and body.get("status") == "ok", f"/health {st} {body}")
    try:
        srv.client(key="wrong").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        fail("a wrong API key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"auth status {e.status_code}")
    st, _, body = srv.raw("GET", "/v1/models", headers={"Authorization": ""})
    check(st == 401 and body["error"]["code"] == "invalid_api_key", f"no key: {st} {body}")
    print("ok: openai client chat/completion, stream and not; models, health, api key")


def check_batch_invariance(srv):
    c = srv.client()
    alone = [chat(c, p, INVARIANCE_TOKENS)[0] for p in PROMPTS]
    st, _, before = srv.raw("GET", "/metrics")
    with ThreadPoolExecutor(INVARIANCE_REQUESTS) as ex:
        together = list(ex.map(lambda p: chat(c, p, INVARIANCE_TOKENS)[0], PROMPTS))
    for p, a, t in zip(PROMPTS, alone, together):
        check(a == t, f"batch changed the text of {p!r}: alone {a!r}, in batch {t!r}")
    st, _, after = srv.raw("GET", "/metrics")
    ones = metric(after, 'hipfire_batch_size_bucket{le="1"}') - metric(before, 'hipfire_batch_size_bucket{le="1"}')
    steps = metric(after, "hipfire_batch_size_count") - metric(before, "hipfire_batch_size_count")
    check(steps > ones, f"no step batched more than one sequence ({steps} steps, {ones} of one)")
    print(f"ok: {INVARIANCE_REQUESTS} concurrent greedy requests == each alone "
          f"({int(steps - ones)} of {int(steps)} steps batched >1)")


def check_bad_requests(srv):
    long_prompt = "word " * (CTX + 50)
    cases = [
        ("malformed JSON", "/v1/chat/completions", b"{not json", 400, None),
        ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None),
        ("messages missing", "/v1/chat/completions", {"model": "m"}, 400, None),
        ("messages wrong type", "/v1/chat/completions", {"messages": "hi"}, 400, None),
        ("max_tokens wrong type", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, 400, None),
        ("temperature wrong type", "/v1/completions",
         {"prompt": "hi", "temperature": "hot"}, 400, None),
        ("stream wrong type", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, None),
        ("max_tokens 0", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
        ("max_tokens -1", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ("prompt over the context", "/v1/completions",
         {"prompt": long_prompt, "max_tokens": 4}, 400, None),
        ("chat over the context", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": long_prompt}]}, 400, None),
        ("top_p out of range", "/v1/completions", {"prompt": "hi", "top_p": 2}, 400, "top_p"),
        ("n > 1", "/v1/completions", {"prompt": "hi", "n": 3}, 400, "n"),
    ]
    for what, path, body, want, param in cases:
        st, _, b = srv.raw("POST", path, body)
        check(st == want, f"{what}: status {st} (want {want}): {b}")
        check(isinstance(b, dict) and isinstance(b.get("error"), dict)
              and isinstance(b["error"].get("message"), str)
              and b["error"].get("type") == "invalid_request_error", f"{what}: body {b}")
        if param:
            check(b["error"].get("param") == param, f"{what}: param {b['error'].get('param')}")
        if "context" in what:
            check(b["error"].get("code") == "context_length_exceeded", f"{what}: code {b}")
    st, _, b = srv.raw("GET", "/no/such/route")
    check(st == 404 and "error" in b, f"unknown route: {st} {b}")
    # The OpenAI client maps the same refusals to its BadRequestError.
    try:
        srv.client().completions.create(model="m", prompt="hi", max_tokens=0)
        fail("max_tokens 0 accepted through the client")
    except openai.BadRequestError as e:
        check(e.status_code == 400, "client status")
    text, _, _ = chat(srv.client(), "Still there?", 4)
    check(text is not None, "server stopped serving after bad requests")
    print(f"ok: {len(cases) + 1} bad requests -> 4xx OpenAI errors; server still serves")


def check_load(srv):
    c = srv.client()
    errors = []
    rss = []
    done = [0]
    lock = threading.Lock()

    def one(i):
        try:
            p = PROMPTS[i % len(PROMPTS)]
            # One in four through the chat template (its default system prompt makes prompts
            # of ~35 tokens), the rest raw completions of a few tokens: prefill stays small.
            kind = i % 4
            if kind == 0:
                chat(c, p, LOAD_MAX_TOKENS, stream=i % 8 == 0)
            elif kind == 1:
                c.completions.create(model="m", prompt=p, max_tokens=LOAD_MAX_TOKENS, temperature=0)
            elif kind == 2:
                c.completions.create(model="m", prompt=p, max_tokens=LOAD_MAX_TOKENS, temperature=0.7, seed=i)
            else:
                list(c.completions.create(model="m", prompt=p, max_tokens=LOAD_MAX_TOKENS, stream=True))
        except Exception as e:  # noqa: BLE001 - every failure counts
            errors.append(f"request {i}: {type(e).__name__}: {e}")
        with lock:
            done[0] += 1
            if done[0] % (LOAD_REQUESTS // 8) == 0:
                rss.append(srv.rss_mib())

    t0 = time.monotonic()
    with ThreadPoolExecutor(LOAD_CONCURRENCY) as ex:
        list(ex.map(one, range(LOAD_REQUESTS)))
    wall = time.monotonic() - t0
    check(not errors, f"{len(errors)} errors under load, first: {errors[:3]}")
    growth = max(rss[2:]) - rss[1]
    check(growth < RSS_GROWTH_LIMIT_MIB, f"RSS grew {growth:.1f} MiB under load: {rss}")
    print(f"ok: load {LOAD_REQUESTS} requests at concurrency {LOAD_CONCURRENCY} in {wall:.1f}s, "
          f"0 errors, RSS MiB {[round(r) for r in rss]}")


def open_stream(srv, max_tokens):
    """A streaming completion on its own connection; returns (connection, response)."""
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=120)
    body = json.dumps({"prompt": "Tell me a long story about a dragon.", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    r = conn.getresponse()
    check(r.status == 200, f"stream status {r.status}")
    return conn, r


def read_events(resp, n):
    """The next n SSE data payloads."""
    out = []
    while len(out) < n:
        line = resp.readline()
        if not line:
            break
        line = line.decode().strip()
        if line.startswith("data: "):
            out.append(line[6:])
    return out


def check_one_slot(hipfire, model):
    srv = Server(hipfire, model, "--parallel", "1", "--queue", "0", "--api-key", API_KEY,
                 "--shutdown-timeout", "60")
    # Full: the one slot streams, the next request is refused with 429 + Retry-After.
    conn, resp = open_stream(srv, 200)
    read_events(resp, 2)
    st, headers, body = srv.raw("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    check(st == 429 and body["error"]["type"] == "rate_limit_error", f"full server: {st} {body}")
    check(any(k.lower() == "retry-after" for k in headers), f"429 without Retry-After: {headers}")
    # A client that disconnects frees its slot: a new request is then admitted.
    conn.close()
    deadline = time.monotonic() + 20
    while True:
        st, _, body = srv.raw("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        if st == 200:
            break
        check(time.monotonic() < deadline, f"slot not freed after disconnect: {st} {body}")
        time.sleep(0.05)
    st, _, m = srv.raw("GET", "/metrics")
    check('status="499"' in m, "the cancelled request was not counted as 499")
    # SIGTERM mid-stream: the stream still completes, then the server exits 0.
    conn, resp = open_stream(srv, 40)
    first = read_events(resp, 3)
    srv.proc.send_signal(signal.SIGTERM)
    rest = read_events(resp, 10_000)
    events = first + rest
    check(events and events[-1] == "[DONE]", f"stream cut by SIGTERM: last {events[-3:]}")
    finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]
              if json.loads(e).get("choices")]
    check(finish[-1] == "length", f"stream after SIGTERM ended with {finish[-1]}")
    conn.close()
    try:
        rc = srv.proc.wait(60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        fail("server did not exit after SIGTERM")
    check(rc == 0, f"exit status {rc} after SIGTERM; stderr: {srv.stderr()}")
    shutil.rmtree(srv.scratch, ignore_errors=True)
    print(f"ok: 429 + Retry-After when full; disconnect frees the slot; SIGTERM mid-stream "
          f"finished {len(events) - 1} chunks and exited 0")


def check_daemon_lock(srv, hipfire, model):
    """A live server holds the daemon lock: a second server and `bench` on the same
    HIPFIRE_HOME are refused while it runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIPFIRE_")}
    env["HIPFIRE_CONFIG"] = os.path.join(srv.scratch, "config.toml")
    env["HIPFIRE_HOME"] = os.path.join(srv.scratch, "home")
    second = subprocess.run([hipfire, "serve", model, "--port", "0"], env=env,
                            capture_output=True, text=True, timeout=60)
    check(second.returncode != 0 and "holds the lock" in second.stderr,
          f"a second server was not refused: rc {second.returncode}, {second.stderr[-400:]!r}")
    bench = subprocess.run([hipfire, "bench", model, "--prompt-tokens", "4", "--gen-tokens", "2"],
                           env=env, capture_output=True, text=True, timeout=60)
    check(bench.returncode == 1 and "daemon" in bench.stderr,
          f"bench beside a live server was not refused: rc {bench.returncode}, "
          f"{bench.stderr[-400:]!r}")
    print("ok: the server holds the daemon lock (a second server and bench are refused)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hipfire", required=True, help="the hipfire binary")
    ap.add_argument("--model", required=True, help="SmolLM2 GGUF")
    a = ap.parse_args()
    t0 = time.monotonic()
    srv = Server(a.hipfire, a.model, "--parallel", "16", "--queue", "64", "--api-key", API_KEY)
    try:
        check_api(srv)
        check_daemon_lock(srv, a.hipfire, a.model)
        check_batch_invariance(srv)
        check_bad_requests(srv)
        check_load(srv)
    except SystemExit:
        print(srv.stderr(), file=sys.stderr)
        srv.proc.kill()
        raise
    rc = srv.stop()
    check(rc == 0, f"exit status {rc}")
    check_one_slot(a.hipfire, a.model)
    print(f"all serve checks passed in {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
