#!/usr/bin/env python3
"""Concurrency benchmark for g4 serve: for each concurrency C, C clients stream one chat completion
of --tokens tokens each, all at the same time, and the table gives the aggregate decode tokens/s (all streams' tokens over the wall time from the first token to the
last), the mean time to first token and the mean per-stream tokens/s after the first token.
Python's standard library only (http.client), so it runs wherever python3 does.

    python3 tests/serve/bench_serve.py --g4 build/release/g4 -m DIR [--tokens 64] [--conc 1,4,8,16] [engine options after --]
    python3 tests/serve/bench_serve.py --url http://127.0.0.1:8080 --model NAME ...

With --g4 it starts `g4 serve --parallel max(conc) --port 0 -m DIR` itself and stops it after.
Every request asks for exactly --tokens tokens: the server is started with --test-ignore-eos so
that a model that stops early (a random synthetic checkpoint stops anywhere) still gives them."""
import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse


def stream_one(host, port, model, prompt, tokens, seed, out):
    t0 = time.time()
    c = http.client.HTTPConnection(host, port, timeout=3600)
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 1.0, "seed": seed}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = last = None
    n = 0
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            if line == "data: [DONE]":
                break
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            n = ev["usage"]["completion_tokens"]
        elif ev["choices"] and ev["choices"][0]["delta"].get("content") is not None and "role" not in ev["choices"][0]["delta"]:
            now = time.time()
            first = first or now
            last = now
    c.close()
    out.append({"t0": t0, "first": first or time.time(), "last": last or time.time(), "tokens": n})


def run(host, port, model, conc, tokens):
    out = []
    threads = [threading.Thread(target=stream_one, args=(host, port, model, "Problem %d: what is %d + %d?" % (i, i, 2 * i), tokens, i, out))
               for i in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min(o["first"] for o in out)
    end = max(o["last"] for o in out)
    toks = sum(o["tokens"] for o in out)
    ttft = sum(o["first"] - o["t0"] for o in out) / conc
    per = sum((o["tokens"] - 1) / (o["last"] - o["first"]) for o in out if o["last"] > o["first"]) / conc
    return toks / (end - start) if end > start else 0, ttft, per, toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--g4")
    ap.add_argument("-m", "--model-dir")
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--conc", default="1,4,8,16")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    concs = [int(x) for x in a.conc.split(",")]
    proc = None
    if a.g4:
        proc = subprocess.Popen([a.g4, "serve", "-m", a.model_dir, "--port", "0", "--parallel", str(max(concs)), "--test-ignore-eos",
                                 "--prompt-cache", "off"] + a.rest, stderr=subprocess.PIPE, text=True)
        url = None
        while url is None:
            line = proc.stderr.readline()
            if not line:
                sys.exit("g4 serve did not start")
            sys.stderr.write(line)
            m = re.search(r"on (http://\S+) \(model (\S+),", line)
            if m:
                url, a.model = m.group(1), m.group(2)
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    else:
        url = a.url
    u = urlparse(url)
    try:
        run(u.hostname, u.port, a.model, 1, 4)  # warm-up: page the weights in
        print("| streams | aggregate decode tokens/s | mean time to first token (s) | mean per-stream tokens/s | tokens |")
        print("|---|---|---|---|---|")
        for conc in concs:
            agg, ttft, per, toks = run(u.hostname, u.port, a.model, conc, a.tokens)
            print("| %d | %.1f | %.3f | %.1f | %d |" % (conc, agg, ttft, per, toks), flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
