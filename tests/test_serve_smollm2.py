#!/usr/bin/env python3
"""test_serve_smollm2.py - issue 19's serving check: `ppn serve` with SmolLM2-135M-Instruct (the fixture's
converted checkpoint, made by fetch.sh) answers a chat completion at temperature 0 with the reference text,
streamed and not, through 4 pipeline stages on the sim backend. A missing checkpoint fails the test with the
fetch command, unless PPN_SMOLLM2_UNAVAILABLE=1 says the fetch cannot run here.
Usage: test_serve_smollm2.py PPN_BIN SMOLLM2_DIR FIXTURES"""
import http.client
import json
import os
import subprocess
import sys
import threading

PPN, MODEL, FIX = sys.argv[1], sys.argv[2], sys.argv[3]
QUESTION = "What is the capital of France?"


def main():
    if not os.path.exists(os.path.join(MODEL, "model.safetensors")):
        if os.environ.get("PPN_SMOLLM2_UNAVAILABLE") == "1":
            print("SKIP: no checkpoint in %s and PPN_SMOLLM2_UNAVAILABLE=1" % MODEL)
            return 77
        print("FAIL: no SmolLM2 checkpoint in %s: run bash %s/real/smollm2/fetch.sh %s" % (MODEL, FIX, MODEL))
        return 1
    ref = json.load(open(os.path.join(FIX, "real/smollm2/reference.json")))
    want = next(p for p in ref["prompts"] if p.get("chat") and p["text"] == QUESTION)["greedy_text"]
    want = want.replace("<|im_end|>", "")  # the answer's content stops before the end of turn
    p = subprocess.Popen([PPN, "serve", "--model", MODEL, "--port", "0", "--backend", "sim", "--stages", "4",
                          "--ctx", "512"], stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        if "listening on http://" in line:
            port = int(line.split("http://")[1].split()[0].rsplit(":", 1)[1])
            def relay():  # the server's stderr after startup: a sanitizer's report must reach the test log
                for ln in p.stderr:
                    sys.stdout.write("serve: " + ln)
                    sys.stdout.flush()
            threading.Thread(target=relay, daemon=True).start()
            break
    if port is None:
        print("FAIL: ppn serve did not start (exit %s)" % p.wait())
        return 1
    fails = []
    body = {"model": "smollm2", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
            "max_tokens": 64}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        d = json.loads(r.read())
        got = d["choices"][0]["message"]["content"] if r.status == 200 else None
        print("chat completion: %r (finish %s)" % (got, d["choices"][0].get("finish_reason") if got else d))
        if got != want:
            fails.append("chat completion %r, reference %r" % (got, want))
        if got is not None and d["choices"][0].get("finish_reason") != "stop":
            fails.append("finish_reason %r, want 'stop' (the end of turn)" % d["choices"][0].get("finish_reason"))
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = ""
        for ev in r.read().decode().split("\n\n"):
            if ev.startswith("data: ") and ev != "data: [DONE]":
                ch = json.loads(ev[6:])["choices"]
                if ch:
                    text += ch[0].get("delta", {}).get("content") or ""
        print("streamed: %r" % text)
        if text != want:
            fails.append("streamed %r, reference %r" % (text, want))
    finally:
        p.terminate()
        p.wait(timeout=120)
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
