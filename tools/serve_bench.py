#!/usr/bin/env python3
"""serve_bench.py - load a running `ppn serve` (or any OpenAI-compatible server) with streaming completions and
report time to first token, inter-token latency (p50 / p99) and throughput as JSON.

  closed loop:  serve_bench.py --url http://127.0.0.1:8080 --clients 16 --requests 64 --prompt-len 512 --output-len 128
  fixed rate:   serve_bench.py --url ... --rate 4 --requests 64 ...   (Poisson arrivals, requests/s)

Prompts are --prompt-len token ids (so the length is exact whatever the tokenizer), outputs --output-len tokens with
the end-of-sequence ignored. Each streamed event is one token's text: ITL is measured between events."""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def one(url, body, timeout):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return {"error": "%d %s" % (r.status, r.read()[:200])}
    stamps, buf = [], b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: ") and ev != b"data: [DONE]":
                d = json.loads(ev[6:])
                if d.get("choices") and d["choices"][0].get("finish_reason") is None:
                    stamps.append(time.perf_counter())
    c.close()
    if not stamps:
        return {"error": "no tokens"}
    return {"ttft": stamps[0] - t0, "itl": [b - a for a, b in zip(stamps, stamps[1:])], "tokens": len(stamps),
            "latency": stamps[-1] - t0}


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(round(q * len(v) + 0.5)) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=16, help="closed loop: concurrent clients")
    ap.add_argument("--rate", type=float, default=0, help="fixed rate: requests/s (Poisson); 0 = closed loop")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [3, vocab)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    bodies = [{"prompt": [rng.randrange(3, a.vocab) for _ in range(a.prompt_len)], "max_tokens": a.output_len,
               "temperature": 0, "ignore_eos": True, "stream": True} for _ in range(a.requests)]
    results, lock, nxt = [], threading.Lock(), [0]

    def run(body):
        r = one(a.url, body, a.timeout)
        with lock:
            results.append(r)

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= a.requests:
                return
            run(bodies[i])
    t0 = time.perf_counter()
    if a.rate > 0:
        ts = []
        for b in bodies:
            t = threading.Thread(target=run, args=(b,))
            t.start()
            ts.append(t)
            time.sleep(rng.expovariate(a.rate))
    else:
        ts = [threading.Thread(target=worker) for _ in range(a.clients)]
        [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    ttft = [r["ttft"] for r in ok]
    itl = [x for r in ok for x in r["itl"]]
    toks = sum(r["tokens"] for r in ok)
    ms = lambda x: None if x is None else round(x * 1e3, 3)
    out = {"url": a.url, "mode": "rate %.3g/s" % a.rate if a.rate > 0 else "closed loop, %d clients" % a.clients,
           "requests": a.requests, "completed": len(ok), "errors": [r["error"] for r in results if "error" in r][:5],
           "prompt_len": a.prompt_len, "output_len": a.output_len, "wall_s": round(wall, 3),
           "output_tok_per_s": round(toks / wall, 2) if wall > 0 else 0,
           "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else 0,
           "ttft_ms": {"p50": ms(pct(ttft, 0.5)), "p99": ms(pct(ttft, 0.99))},
           "itl_ms": {"p50": ms(pct(itl, 0.5)), "p99": ms(pct(itl, 0.99))}}
    print(json.dumps(out, indent=1))
    return 0 if len(ok) == a.requests else 1


if __name__ == "__main__":
    sys.exit(main())
