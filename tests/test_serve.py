#!/usr/bin/env python3
"""test_serve.py - `ppn serve` driven over loopback by a real client (python3's http.client): a tiny random model
with Llama 2's tokenizer and chat template; completions and chat, with and without streaming; 32 concurrent
clients x 10 requests, every answer checked against the same request run alone (temperature 0); a client that
disconnects mid-stream cancels its request; the bad-input list answers 400 and the server keeps serving; SIGTERM
under load stops it cleanly; tools/serve_bench.py reports on a short load. Usage: test_serve.py PPN_BIN FIXTURES"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PPN, FIX = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def relay(stream):
    """The server's stderr after startup, passed on: a sanitizer's report (ASan, TSan) must reach the test log."""
    for line in stream:
        sys.stdout.write("serve: " + line)
        sys.stdout.flush()


def start(model, *extra):
    p = subprocess.Popen([PPN, "serve", "--model", model, "--port", "0", "--ctx", "256", "--max-body", "4096",
                          "--backend", "sim", *extra], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "listening on http://" in line:
            port = int(line.split("http://")[1].split()[0].rsplit(":", 1)[1])
            threading.Thread(target=relay, args=(p.stderr,), daemon=True).start()
            return p, port
    raise SystemExit("ppn serve did not start: exit %s" % p.wait())


def request(port, method, path, body=None, raw=None, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read().decode()
    c.close()
    return r.status, out


def post(port, path, body):
    st, out = request(port, "POST", path, body)
    return st, json.loads(out)


def stream(port, path, body):
    """The concatenated text of a streamed answer, its finish reason and whether [DONE] came."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text, finish, done = "", None, False
    for line in r.read().decode().split("\n"):
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        ev = json.loads(line[6:])
        ch = ev["choices"][0]
        text += ch.get("text", "") if "text" in ch else ch["delta"].get("content", "")
        finish = ch["finish_reason"] or finish
    c.close()
    return text, finish, done


def answer_text(path, a):
    ch = a["choices"][0]
    return ch["text"] if path == "/v1/completions" else ch["message"]["content"]


def metric(port, name):
    st, out = request(port, "GET", "/metrics")
    for line in out.split("\n"):
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def main():
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "m")
    subprocess.run([PPN, "mkmodel", "--shape", "tiny", "--tokenizer", os.path.join(FIX, "tok/llama2"), "--out",
                    model], check=True, capture_output=True)
    shutil.copy(os.path.join(FIX, "chat/llama2.jinja"), os.path.join(model, "chat_template.jinja"))
    srv, port = start(model, "--max-batch", "16", "--chunk", "64")
    try:
        run_all(port)
        bench(port)
        shutdown_under_load(srv, port)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
        shutil.rmtree(tmp)
    print("%d passed, %d failed" % (1 if not failures else 0, 1 if failures else 0))
    return 1 if failures else 0


def run_all(port):
    st, out = request(port, "GET", "/health")
    check(st == 200 and json.loads(out)["status"] == "ok", "health")
    st, out = request(port, "GET", "/v1/models")
    check(st == 200 and json.loads(out)["data"][0]["max_model_len"] == 256, "models")

    # the requests, and each one's answer alone
    words = ["Once upon a time", "The cat sat", "In a galaxy far away", "Hello", "Numbers: 1 2 3", "Über café"]
    reqs = []
    for i in range(16):
        if i % 2 == 0:
            reqs.append(("/v1/completions", {"prompt": words[i % 6] + " " * (i // 6), "max_tokens": 6 + i % 5,
                                             "temperature": 0, "ignore_eos": True}))
        else:
            reqs.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": words[i % 6] * (1 + i % 3)}],
                                                  "max_tokens": 5 + i % 4, "temperature": 0, "ignore_eos": True}))
    alone = []
    for path, body in reqs:
        st, a = post(port, path, body)
        check(st == 200, "alone %s: %s" % (path, a))
        alone.append(answer_text(path, a))
        check(a["usage"]["completion_tokens"] == body["max_tokens"], "usage counts the tokens")
    # streaming gives the same text
    for k in (0, 1):
        text, finish, done = stream(port, *reqs[k])
        check(text == alone[k] and finish == "length" and done, "stream %d: %r vs %r" % (k, text, alone[k]))

    # 32 concurrent clients x 10 requests, half of them streamed
    errs = []

    def client(c):
        try:
            client_requests(c)
        except Exception as e:  # a timeout or a closed connection is a failure, never a silent thread exit
            errs.append((c, "exception", repr(e)))

    def client_requests(c):
        for j in range(10):
            k = (c * 10 + j) % len(reqs)
            path, body = reqs[k]
            if (c + j) % 2:
                text, finish, done = stream(port, path, body)
                ok = done and finish == "length"
            else:
                st, a = post(port, path, body)
                text, ok = answer_text(path, a) if st == 200 else None, st == 200
            if not ok or text != alone[k]:
                errs.append((c, j, k, text, alone[k]))
    ts = [threading.Thread(target=client, args=(c,)) for c in range(32)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check(not errs, "concurrent answers differ from the one-at-a-time run: %s" % errs[:3])

    # stop strings end the text before them
    path, body = reqs[0]
    if len(alone[0]) > 4:
        stop = alone[0][2:4]
        st, a = post(port, path, dict(body, stop=[stop]))
        check(st == 200 and answer_text(path, a) == alone[0][:alone[0].index(stop)] and
              a["choices"][0]["finish_reason"] == "stop", "stop string: %r" % (a,))

    # a client that disconnects mid-stream cancels its request
    before = metric(port, 'ppn_requests_total{outcome="cancelled"}') or 0
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "stream": True})
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
               "\r\n\r\n%s" % (len(body), body)).encode())
    got = s.recv(4096)
    check(b"200" in got.split(b"\r\n")[0], "stream started")
    s.close()
    deadline = time.time() + 10
    while time.time() < deadline and (metric(port, 'ppn_requests_total{outcome="cancelled"}') or 0) <= before:
        time.sleep(0.05)
    check((metric(port, 'ppn_requests_total{outcome="cancelled"}') or 0) > before, "disconnect cancels")

    # the bad-input list: 400 with an OpenAI error body, and the server keeps serving
    bad = [b'{"prompt": "x",', b'[1, 2]', b'not json',
           json.dumps({"prompt": "x", "temperature": "hot"}).encode(),
           json.dumps({"prompt": "x", "max_tokens": "5"}).encode(),
           json.dumps({"prompt": "x", "stream": "yes"}).encode(),
           json.dumps({"prompt": 5}).encode(),
           json.dumps({"prompt": "x", "temperature": -1}).encode(),
           json.dumps({"prompt": "x", "top_p": 2}).encode(),
           json.dumps({"prompt": "x", "n": 2}).encode(),
           json.dumps({"prompt": "x", "stop": [1]}).encode(),
           json.dumps({"prompt": [3] * 300}).encode(),           # past the context of 256
           json.dumps({"prompt": [99999]}).encode(),             # outside the vocabulary
           json.dumps({"prompt": "x" * 5000}).encode()]          # past --max-body 4096
    for raw in bad:
        st, out = request(port, "POST", "/v1/completions", raw=raw)
        try:
            msg = json.loads(out)["error"]["message"]
        except Exception:
            msg = None
        check(st == 400 and msg, "bad input %r: %d %s" % (raw[:40], st, out[:200]))
    for raw in (json.dumps({"messages": "hi"}).encode(), json.dumps({"messages": [{"role": "user"}]}).encode()):
        st, out = request(port, "POST", "/v1/chat/completions", raw=raw)
        check(st == 400, "bad chat %r: %d" % (raw, st))
    st, out = request(port, "GET", "/nowhere")
    check(st == 404, "404")
    st, a = post(port, *reqs[0])
    check(st == 200 and answer_text(reqs[0][0], a) == alone[0], "still serving after bad input")
    st, out = request(port, "GET", "/metrics")
    for name in ("ppn_time_to_first_token_seconds_bucket", "ppn_inter_token_latency_seconds_count",
                 "ppn_requests_queued", "ppn_requests_running", "ppn_kv_blocks_used",
                 "ppn_generation_tokens_per_second"):
        check(name in out, "metrics has " + name)
    busy = [float(l.split()[-1]) for l in out.splitlines() if l.startswith("ppn_stage_busy_seconds_total{stage=")]
    check(busy and all(b > 0 for b in busy), "metrics: every stage busy after the answers: %r" % busy)


def bench(port):
    """tools/serve_bench.py against the server, briefly: its JSON report counts every request, gives each stage a
    busy fraction in (0, 1] from /metrics, and its SVG draws the two distributions, a point per sample."""
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "serve_bench.py")
    fd, svg = tempfile.mkstemp(suffix=".svg")
    os.close(fd)
    r = subprocess.run([sys.executable, tool, "--url", "http://127.0.0.1:%d" % port, "--clients", "3", "--requests",
                        "6", "--prompt-len", "40", "--output-len", "6", "--plot", svg], capture_output=True, text=True,
                       timeout=300)
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(out.get("completed") == 6 and out["itl_ms"]["p50"] is not None and out["output_tok_per_s"] > 0,
          "serve_bench: %s %s" % (r.stdout[-300:], r.stderr[-300:]))
    busy = out.get("stage_busy_fraction") or {}
    check(busy and all(0 < f <= 1 for f in busy.values()), "serve_bench: stage busy fractions %r" % busy)
    with open(svg) as f:
        text = f.read()
    os.unlink(svg)
    lines = re.findall(r'<polyline class="cdf"[^>]*points="([^"]*)"', text)
    n = out.get("samples", {})
    check(text.startswith("<svg") and len(lines) == 2 and n.get("ttft") == 6 and n.get("itl", 0) > 0 and
          [len(l.split()) for l in lines] == [n["ttft"], n["itl"]],
          "serve_bench --plot: a point per TTFT and ITL sample %s: %s" % (n, [len(l.split()) for l in lines]))


def shutdown_under_load(srv, port):
    results = []

    def client():
        try:
            results.append(stream(port, "/v1/completions", {"prompt": "Once", "max_tokens": 240, "ignore_eos": True}))
        except Exception as e:  # a connection closed by the stopping server is an acceptable end
            results.append(("", "closed: %s" % e, False))
    ts = [threading.Thread(target=client) for _ in range(8)]
    [t.start() for t in ts]
    time.sleep(0.5)
    srv.send_signal(signal.SIGTERM)
    try:
        rc = srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, "SIGTERM under load: exit %s" % rc)
    [t.join(timeout=30) for t in ts]
    check(len(results) == 8, "every client got an end")


if __name__ == "__main__":
    sys.exit(main())
