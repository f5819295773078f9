#!/usr/bin/env python3
"""serve_bench.py - load a running `ppn serve` (or any OpenAI-compatible server) with streaming completions and
report time to first token, inter-token latency (p50 / p99) and throughput as JSON.

  closed loop:  serve_bench.py --url http://127.0.0.1:8080 --clients 16 --requests 64 --prompt-len 512 --output-len 128
  fixed rate:   serve_bench.py --url ... --rate 4 --requests 64 ...   (Poisson arrivals, requests/s)

Prompts are --prompt-len token ids (so the length is exact whatever the tokenizer), outputs --output-len tokens with
the end-of-sequence ignored. Each streamed event is one token's text: ITL is measured between events.

--plot FILE.svg draws the distributions (TTFT and ITL, cumulative, in ms) as an SVG of its own. Where the server's
/metrics has ppn_stage_busy_seconds_total (ppn serve), the report adds each stage's busy fraction over the run: the
device time its stream spent in the model's layers per second of wall time (1 - that is the device idle, waiting on
the host between iterations or on the other stages)."""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse
import urllib.request


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


def metrics(url):
    """The server's /metrics text, or None."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as r:
            return r.read().decode("utf-8", "replace")
    except Exception:
        return None


def stage_busy(url, wait_idle_s=0.0):
    """{stage: busy seconds} from the server's /metrics (ppn serve's ppn_stage_busy_seconds_total), or None. With
    wait_idle_s, first waits up to that long for ppn_requests_running and ppn_requests_queued to read 0: ppn serve
    publishes those with the busy counters, which are exact once it is idle (a running walk is counted when it
    completes, so a window opened on a busy server would count the walks running at its start)."""
    t_end = time.perf_counter() + wait_idle_s
    while True:
        text = metrics(url)
        if text is None:
            return None
        g = {}
        for line in text.splitlines():
            if line.startswith(("ppn_requests_running ", "ppn_requests_queued ")):
                g[line.split()[0]] = float(line.split()[-1])
        if not g or not any(g.values()) or time.perf_counter() >= t_end:
            break
        time.sleep(0.01)
    out = {}
    for line in text.splitlines():
        if line.startswith("ppn_stage_busy_seconds_total{stage=\""):
            out[line.split("\"")[1]] = float(line.split()[-1])
    return out or None


def svg_cdf(path, title, series):
    """series: [(name, values in ms, colour)]: each one's cumulative distribution on one log-scaled ms axis."""
    import math
    W, H, L, R, T, B = 720, 420, 70, 20, 40, 60
    vals = [v for _, vs, _ in series for v in vs if v > 0]
    lo, hi = (min(vals), max(vals)) if vals else (1.0, 10.0)
    lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
    if hi <= lo:
        hi = lo * 10
    x = lambda v: L + (W - L - R) * (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    y = lambda f: H - B - (H - T - B) * f
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="22" font-size="14">%s</text>' % (L, title.replace("&", "&amp;").replace("<", "&lt;"))]
    d = lo
    while d <= hi * 1.0001:
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x(d), T, x(d), H - B))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x(d), H - B + 16, d))
        d *= 10
    for f in (0, 0.5, 0.9, 0.99, 1):
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y(f), W - R, y(f)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 6, y(f) + 4, f))
    o.append('<text x="%d" y="%d" text-anchor="middle">ms (log scale)</text>' % ((L + W - R) // 2, H - 20))
    o.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">fraction at or below</text>'
             % ((T + H - B) // 2, (T + H - B) // 2))
    for k, (name, vs, colour) in enumerate(series):
        vs = sorted(vs)  # every sample: one at or below the axis' start (0 ms included) is drawn there
        if vs:
            pts = " ".join("%.1f,%.1f" % (x(v), y((i + 1) / len(vs))) for i, v in enumerate(vs))
            o.append('<polyline class="cdf" fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (colour, pts))
        o.append('<text x="%d" y="%d" fill="%s">%s (%d)</text>' % (L + 10, T + 16 + 16 * k, colour, name, len(vs)))
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


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
    ap.add_argument("--plot", help="write the TTFT and ITL distributions as an SVG here")
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
    busy0 = stage_busy(a.url, wait_idle_s=60.0)  # the window opens on an idle server
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
    busy1 = stage_busy(a.url, wait_idle_s=60.0)  # and closes once its last iteration is published
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
           "itl_ms": {"p50": ms(pct(itl, 0.5)), "p99": ms(pct(itl, 0.99))},
           "samples": {"ttft": len(ttft), "itl": len(itl)},
           "stage_busy_fraction": {k: round((busy1[k] - busy0.get(k, 0.0)) / wall, 4) for k in busy1}
           if busy1 and busy0 is not None and wall > 0 else None}
    if a.plot:
        svg_cdf(a.plot, "%s: %s, prompts %d, outputs %d: %.1f output tok/s" % (a.url, out["mode"], a.prompt_len,
                                                                            a.output_len, out["output_tok_per_s"]),
                [("time to first token", [v * 1e3 for v in ttft], "#1f77b4"),
                 ("inter-token latency", [v * 1e3 for v in itl], "#d62728")])
        out["plot"] = a.plot
    print(json.dumps(out, indent=1))
    return 0 if len(ok) == a.requests else 1


if __name__ == "__main__":
    sys.exit(main())
